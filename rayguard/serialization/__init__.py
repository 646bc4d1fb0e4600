"""rayguard.serialization"""
