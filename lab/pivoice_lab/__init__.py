"""The lab: bench, simulated room and loopback ports. Not shipped to a Pi nor in the add-on;
installed for development by script/setup (without --runtime)."""
