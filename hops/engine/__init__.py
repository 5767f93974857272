"""The discrete-event engine: a scenario and a scheduler in, a Timeline out."""
