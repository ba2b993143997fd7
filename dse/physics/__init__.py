"""Physics: the vectorized roofline of one replica, layouts, per-layer times, training steps."""
