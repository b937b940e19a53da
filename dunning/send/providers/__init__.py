"""dunning/providers"""
