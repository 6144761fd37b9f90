"""Real test servers on 127.0.0.1 for the load generator's tests (and anyone else's)."""
