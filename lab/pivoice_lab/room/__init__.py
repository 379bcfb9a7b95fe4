"""A simulated room for the satellite: its speaker's sound comes back into its microphone."""
