"""`python -m tritune` is `tune-cli`."""
from tritune.tuner.cli import main

main()
