"""rayguard.checkpoint"""
