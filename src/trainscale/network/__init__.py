"""The network probe: its definitions, its jobs and records, what each rank runs."""
