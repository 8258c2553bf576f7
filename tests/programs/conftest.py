"""The programs' own files are scripts run by test_programs.py, never collected: importing one
would run it (and parse pytest's command line as its own)."""

collect_ignore_glob = ["*/*"]
