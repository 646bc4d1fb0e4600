"""rayguard.tune"""
