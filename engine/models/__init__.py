"""Loading a target/draft pair (HF ids or local folders), EAGLE-3 heads, their checks and weight files, and where
a pair goes on the visible devices."""
