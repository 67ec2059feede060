"""Money: what things cost and who pays: the ledger, the price book, offers and quotes, reserved plans, committed
spend, per-second and usage metering, when overdrawn work stops, statements."""
