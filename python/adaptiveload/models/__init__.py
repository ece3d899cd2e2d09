"""Model configurations AdaptiveLoad knows how to build and calibrate."""
