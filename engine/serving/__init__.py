"""What serving needs of the operating system, stdlib only: a process tree, ended as a whole."""
