"""``xgrad.testing``: gradient checks and hypothesis strategies for your own ops and Functions."""
