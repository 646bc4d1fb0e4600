"""rayguard.doctor"""
