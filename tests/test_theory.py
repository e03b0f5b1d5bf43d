import pytest

from engine.metrics.theory import best_k, expected_accepted, expected_tokens_per_round, predicted_speedup


def test_expected_tokens_per_round_is_a_geometric_sum():
    for alpha in (0.0, 0.3, 0.8, 0.99):
        for k in (1, 4, 9):
            assert expected_tokens_per_round(alpha, k) == pytest.approx(sum(alpha**i for i in range(k + 1)))
    assert expected_tokens_per_round(1.0, 5) == 6
    assert expected_accepted(0.8, 4) == pytest.approx(0.8 * (1 - 0.8**4) / 0.2)


def test_predicted_speedup_matches_the_article():
    # (1 - a^(k+1)) / ((1 - a)(1 + k/c))
    assert predicted_speedup(0.8, 4, 8) == pytest.approx((1 - 0.8**5) / (0.2 * 1.5))
    assert predicted_speedup(1.0, 3, 6) == pytest.approx(4 / 1.5)
    assert predicted_speedup(0.0, 2, 10) < 1  # a useless draft only costs time


def test_best_k_is_the_argmax_and_grows_with_alpha_and_c():
    k, s = best_k(0.8, 8)
    assert s == max(predicted_speedup(0.8, j, 8) for j in range(1, 33))
    assert best_k(0.9, 8)[0] >= k >= best_k(0.6, 8)[0]
    assert best_k(0.8, 30)[0] >= k
