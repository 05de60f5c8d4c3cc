"""`mlxswitch bench --suite humaneval`: HumanEval problems, decoded by every arm, pass@1 by execution."""
