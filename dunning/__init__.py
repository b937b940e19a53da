"""dunning"""
