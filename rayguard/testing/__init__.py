"""rayguard.testing"""
