"""The store transaction's operations, one module per record (:class:`turnkit.store.store.StoreTx`)."""
