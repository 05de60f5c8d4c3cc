"""`mlxswitch bench`: a fixed prompt suite (prompts.py) and pure routing/speed metrics (metrics.py)."""
