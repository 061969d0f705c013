"""A broker for a deployment: `broker init` files (passwords, ACL, TLS), bridged sites, a local Mosquitto."""
