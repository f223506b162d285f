"""Jobs, quotes, leases and matching: built in the broker issue."""
