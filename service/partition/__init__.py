"""One partition's format, read by the shard that writes it and by same-host routers alike:
key layout (``layout``), how values combine (``codec``), the META record (``meta``), reading
a key's windows (``reader``) and the files beside the RocksDB (``files``)."""
