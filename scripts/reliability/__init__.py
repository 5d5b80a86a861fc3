"""A long tuning run on a GPU, its worker killed and restarted again and again (`soak`); the kill
harness itself is tests/helpers/kill_harness.py."""
