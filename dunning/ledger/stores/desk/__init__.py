"""The collections desk's tables (`dunning.desk`), one store per table group: promises to pay
(`promise_store`), customers' replies, their acknowledgements and the IMAP cursors (`reply_store`), notes and the
reads of one customer's whole story (`customer_store`). Imports the schema, `sql` and the base, like every store."""
