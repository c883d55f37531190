"""The router: any router answers any key by routing it to the shard that owns it."""
