"""dunning/ledger"""
