"""The standalone front: pipeline.py (the streaming pipeline: turns out of endpointing events,
each turn's server stages chained, the replies played in order). It builds on the shared core
(listener, turn_policy, turns, assemble, stages) and never imports the Home Assistant front."""
