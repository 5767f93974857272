"""The physics of a scenario: what each layer, stage, link and collective costs in time and memory."""
