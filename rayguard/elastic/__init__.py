"""rayguard.elastic"""
