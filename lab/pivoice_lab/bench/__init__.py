"""`wyoming-pivoice bench`: whole voice turns on one clock, peers, knobs and the soak."""
