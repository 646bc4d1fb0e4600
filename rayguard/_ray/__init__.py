"""The only home of Ray's private internals in rayguard (checked against the installed Ray)."""
