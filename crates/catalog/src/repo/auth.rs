//! Users, tokens, roles and bindings.
