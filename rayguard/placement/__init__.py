"""rayguard.placement"""
