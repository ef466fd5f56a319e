"""Traffic for modpipe: post factories, the smoke check and (later) the load generator."""
