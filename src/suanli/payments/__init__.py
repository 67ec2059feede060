"""Payment providers: adapters that turn a provider's signed webhook into a `TopUpEvent` (`base`), and the generic
HMAC-SHA256 provider shipped with suanli (`hmac_provider`). Posting the top-up is the services' part
(`control.money.payments`). See docs/payments.md for writing the adapter of a real provider."""
