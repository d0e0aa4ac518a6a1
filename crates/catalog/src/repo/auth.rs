//! Users, tokens, roles and bindings: what authentication and RBAC read.
//!
//! Tokens are stored only as the hex SHA-256 of the token, keyed by that
//! hash (`/tokens/<hash>`), so authenticating a request is one read and a
//! leaked store dump cannot be replayed as credentials. A token's public
//! `id` is the first [`TOKEN_ID_LEN`] hex digits of its hash: stable,
//! derivable without a second index, and useless for forging the token
//! (it is a prefix of a hash of 256 random bits). Revoking by id is a prefix
//! listing of `/tokens/<id>`.
//!
//! Authentication also requires the token's user to exist.
//!
//! With [`crate::cache::AuthCache`] attached (`kayra serve`), authentication
//! and RBAC decide from memory: what the caches grant is final, while a
//! token they do not know or a denial is confirmed against the store first.
//! Without it every decision reads the store.
//!
//! Each token also has an index key under its user
//! (`/usertokens/<user>/<hash>`), written in the token's own transaction,
//! which compares that the user exists; a user's delete removes the user,
//! the index and every indexed token in one transaction that holds only if
//! no index entry appeared since it was read. So a token issued while its
//! user is deleted cannot survive to authenticate a user re-created under
//! that name. The bootstrap token's hash is kept at `/bootstraptoken`, so a
//! start with a different bootstrap token revokes exactly the previous one
//! (platform §5.4).

use std::collections::BTreeSet;
use std::time::SystemTime;

use base64::Engine;
use kayra_core::{ClusterRoleBinding, Role, RoleBinding, Rule, TokenRecord, User};
use kayra_rbac::{Decision, authorize};
use rand::RngCore;
use sha2::{Digest, Sha256};

use kayra_store::{Compare, Op, Txn};

use super::{Change, Collection, Error, RecordRef, Repository, Result, encode, keys};

/// Attempts of a guarded write whose guards moved underneath it.
const GUARDED_ATTEMPTS: usize = 20;

/// Bytes of randomness in a generated token (the contract asks for ≥ 32).
pub const TOKEN_BYTES: usize = 32;
/// Hex digits of the hash that form a token's public id (64 bits).
pub const TOKEN_ID_LEN: usize = 16;
/// Prefix of generated tokens, so secret scanners can recognise them.
const TOKEN_PREFIX: &str = "kayra_";

/// The bootstrap objects of platform contract §5.4.
pub const BOOTSTRAP_ROLE: &str = "sysadmin";
pub const BOOTSTRAP_USER: &str = "admin";
pub const BOOTSTRAP_BINDING: &str = "admin-sysadmin";

/// A freshly issued token: the only time the secret is ever visible.
#[derive(Clone, PartialEq, Eq)]
pub struct IssuedToken {
    pub id: String,
    pub token: String,
    pub created_at: String,
}

impl std::fmt::Debug for IssuedToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The secret never reaches a log line, even through `{:?}`.
        f.debug_struct("IssuedToken").field("id", &self.id).field("created_at", &self.created_at).finish()
    }
}

/// Hex SHA-256 of a token: the only form in which it is stored.
pub fn hash_token(token: &str) -> String {
    // Into a buffer at once: `hex::encode` pushes the 64 digits one `char`
    // at a time, and this runs for every authenticated request.
    let digest = Sha256::digest(token.as_bytes());
    let mut digits = [0u8; 64];
    match hex::encode_to_slice(digest, &mut digits).ok().and_then(|()| std::str::from_utf8(&digits).ok()) {
        Some(hex) => hex.to_owned(),
        None => hex::encode(digest),
    }
}

/// A token's public id, from its hash.
pub fn token_id(hash: &str) -> &str {
    hash.get(..TOKEN_ID_LEN).unwrap_or(hash)
}

/// Whether `id` has the shape of a token id (lowercase hex of the right length).
pub fn is_token_id(id: &str) -> bool {
    id.len() == TOKEN_ID_LEN && id.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

/// A new random token: [`TOKEN_BYTES`] from the OS-seeded CSPRNG, base64url.
pub fn generate_token() -> String {
    let mut bytes = [0u8; TOKEN_BYTES];
    rand::rng().fill_bytes(&mut bytes);
    format!("{TOKEN_PREFIX}{}", base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes))
}

/// The rule of the bootstrap role: every api, resource and verb.
pub fn everything() -> Rule {
    Rule { apis: vec!["*".into()], resources: vec!["*".into()], verbs: vec!["*".into()] }
}

/// A cache that cannot decide is the store being unavailable to this
/// process: 503, never a decision from stale data.
pub(crate) fn unavailable(e: crate::cache::Error) -> Error {
    Error::Store(kayra_store::Error::Unavailable(e.to_string()))
}

fn now_rfc3339() -> String {
    humantime::format_rfc3339_seconds(SystemTime::now()).to_string()
}

impl Repository {
    pub async fn get_user(&self, name: &str) -> Result<Option<super::Versioned<User>>> {
        self.get(RecordRef::User(name)).await
    }

    /// Deletes a user and its tokens in one transaction (see the module
    /// docs). Bindings naming the user are left alone (as Kubernetes does):
    /// they grant nothing without a token.
    pub async fn delete_user(&self, name: &str) -> Result<()> {
        let what = format!("user {name:?}");
        let index = keys::user_tokens(name);
        for _ in 0..GUARDED_ATTEMPTS {
            let (indexed, at) = self.base.store.list_all(&index).await?;
            let user = self.get_user(name).await?.ok_or_else(|| Error::NotFound(what.clone()))?;
            let mut txn = Txn::new()
                .when(Compare::ModRevision(keys::user(name), user.revision))
                .when(Compare::PrefixUnchangedSince(index.clone(), at))
                .then(Op::Delete { key: keys::user(name) })
                .then(Op::DeletePrefix { prefix: index.clone() });
            for kv in &indexed {
                if let Some(hash) = kv.key.strip_prefix(&index) {
                    txn = txn.then(Op::Delete { key: keys::token(hash) });
                }
            }
            let handle = self.auditing(super::audit::shown(&user.value), serde_json::Value::Null);
            if !handle.txn(txn).await?.succeeded {
                continue;
            }
            // Tokens stored before the index existed: swept after the fact.
            for token in self.list_user_tokens(name).await? {
                match self.delete(RecordRef::Token(&token.hash), None, "token").await {
                    Ok(_) | Err(Error::NotFound(_)) => {}
                    Err(e) => return Err(e),
                }
            }
            return Ok(());
        }
        Err(Error::Conflict(format!("{what} keeps changing; try again")))
    }

    /// Issues a new random token for `user`, which must exist.
    pub async fn issue_token(&self, user: &str) -> Result<IssuedToken> {
        let token = generate_token();
        let record = self.store_token(user, &token).await?;
        Ok(IssuedToken { id: record.id, token, created_at: record.created_at })
    }

    /// Stores `token` (hashed) for `user`, which must exist (`NotFound`),
    /// with its index key, in one transaction; a token already stored keeps
    /// its record but is re-pointed at `user`. Idempotent, for bootstrap.
    pub async fn store_token(&self, user: &str, token: &str) -> Result<TokenRecord> {
        let hash = hash_token(token);
        let key = keys::token(&hash);
        let record =
            TokenRecord { id: token_id(&hash).to_string(), user: user.to_string(), hash, created_at: now_rfc3339() };
        for _ in 0..GUARDED_ATTEMPTS {
            let stored = self.get_key::<TokenRecord>(&key).await?;
            let mut txn = Txn::new()
                .when(Compare::Exists(keys::user(user)))
                .then(Op::Put { key: keys::user_token(user, &record.hash), value: encode(&key) })
                .otherwise(Op::Get { key: keys::user(user) });
            let value = match &stored {
                None => {
                    txn = txn.when(Compare::Absent(key.clone()));
                    record.clone()
                }
                Some(stored) => {
                    txn = txn.when(Compare::ModRevision(key.clone(), stored.revision));
                    if stored.value.user != user {
                        txn = txn.then(Op::Delete { key: keys::user_token(&stored.value.user, &record.hash) });
                    }
                    TokenRecord { user: user.to_string(), ..stored.value.clone() }
                }
            };
            txn = txn.then(Op::Put { key: key.clone(), value: encode(&value) });
            // A token is only ever its id in a record (platform §13).
            let handle = self.auditing(serde_json::Value::Null, serde_json::json!({ "id": value.id }));
            let resp = handle.txn(txn).await?;
            if resp.succeeded {
                return Ok(value);
            }
            if resp.gets.first().is_some_and(Option::is_none) {
                return Err(Error::NotFound(format!("user {user:?}")));
            }
        }
        Err(Error::Conflict("token keeps changing; try again".into()))
    }

    /// A user's tokens, sorted by id. Tokens are keyed by hash, so this scans
    /// every token: there are few, and it keeps authentication one read.
    pub async fn list_user_tokens(&self, user: &str) -> Result<Vec<TokenRecord>> {
        let (all, _) = self.list_all::<TokenRecord>(Collection::Tokens).await?;
        let mut tokens: Vec<_> = all.into_iter().map(|v| v.value).filter(|t| t.user == user).collect();
        tokens.sort_by(|a, b| a.id.cmp(&b.id));
        Ok(tokens)
    }

    /// One of `user`'s tokens, by id.
    pub async fn get_user_token(&self, user: &str, id: &str) -> Result<Option<TokenRecord>> {
        if !is_token_id(id) {
            return Ok(None);
        }
        let (matches, _) = self.list_all_key::<TokenRecord>(&keys::token(id)).await?;
        Ok(matches.into_iter().map(|v| v.value).find(|t| t.user == user && t.id == id))
    }

    /// Revokes one of `user`'s tokens: the next request with it is refused.
    pub async fn revoke_token(&self, user: &str, id: &str) -> Result<()> {
        let what = format!("token {id:?} of user {user:?}");
        let token = self.get_user_token(user, id).await?.ok_or_else(|| Error::NotFound(what.clone()))?;
        let txn = Txn::new()
            .when(Compare::Exists(keys::token(&token.hash)))
            .then(Op::Delete { key: keys::token(&token.hash) })
            .then(Op::Delete { key: keys::user_token(user, &token.hash) });
        let handle = self.auditing(serde_json::json!({ "id": token.id }), serde_json::Value::Null);
        if !handle.txn(txn).await?.succeeded {
            return Err(Error::NotFound(what));
        }
        Ok(())
    }

    /// The user a bearer token belongs to, if the token is known and its
    /// user still exists.
    pub async fn authenticate(&self, token: &str) -> Result<Option<String>> {
        if token.is_empty() {
            return Ok(None);
        }
        let hash = hash_token(token);
        if let Some(cache) = self.cache() {
            cache.ready().await.map_err(unavailable)?;
            if let Some(user) = cache.token_user(&hash) {
                return Ok(Some(user));
            }
        }
        // Boxed: the store's reads would make every request's future (the
        // caches' answer included) as large as theirs.
        Box::pin(self.token_user_from_store(&hash)).await
    }

    /// The user of the token whose hash is `hash`, read from the store.
    async fn token_user_from_store(&self, hash: &str) -> Result<Option<String>> {
        let Some(record) = self.get::<TokenRecord>(RecordRef::Token(hash)).await? else {
            return Ok(None);
        };
        Ok(self.get_user(&record.value.user).await?.map(|_| record.value.user))
    }

    /// The RBAC decision on `request` for `user`: their cluster roles, and
    /// when those do not grant it and the request goes into `namespace`
    /// (the gateway), their role bindings there. From the caches when
    /// attached; a denial is confirmed against the store before it stands.
    pub async fn decide(
        &self,
        user: &str,
        namespace: Option<&str>,
        request: &kayra_rbac::Request<'_>,
    ) -> Result<Decision> {
        if let Some(cache) = self.cache() {
            cache.ready().await.map_err(unavailable)?;
            let decision = match cache.cluster_decision(user, request) {
                Decision::Deny => match namespace {
                    Some(ns) => cache.namespace_decision(ns, user, request),
                    None => Decision::Deny,
                },
                allowed => allowed,
            };
            if decision.is_allowed() {
                return Ok(decision);
            }
        }
        // Boxed, as in `authenticate`.
        Box::pin(self.decide_from_store(user, namespace, request)).await
    }

    /// [`Repository::decide`] from the roles in the store.
    async fn decide_from_store(
        &self,
        user: &str,
        namespace: Option<&str>,
        request: &kayra_rbac::Request<'_>,
    ) -> Result<Decision> {
        Ok(match authorize(&self.cluster_roles(user).await?, request) {
            Decision::Deny => match namespace {
                Some(ns) => authorize(&self.namespace_roles(ns, user).await?, request),
                None => Decision::Deny,
            },
            allowed => allowed,
        })
    }

    /// The names of the roles bound to `user` by cluster role bindings,
    /// sorted and deduplicated (whether or not the roles exist).
    pub async fn cluster_role_names(&self, user: &str) -> Result<Vec<String>> {
        let (bindings, _) = self.list_all::<ClusterRoleBinding>(Collection::ClusterRoleBindings).await?;
        let names: BTreeSet<String> =
            bindings.into_iter().filter(|b| b.value.user == user).map(|b| b.value.role).collect();
        Ok(names.into_iter().collect())
    }

    /// The existing roles bound to `user` everywhere: what
    /// `rbac.RequireClusterRBAC` decides with. A binding to a missing role
    /// grants nothing.
    pub async fn cluster_roles(&self, user: &str) -> Result<Vec<Role>> {
        let mut roles = Vec::new();
        for name in self.cluster_role_names(user).await? {
            if let Some(role) = self.get::<Role>(RecordRef::Role(&name)).await? {
                roles.push(role.value);
            }
        }
        Ok(roles)
    }

    /// The existing roles bound to `user` by role bindings in `namespace`
    /// (`/rolebindings/<namespace>/<name>`), deduplicated. They apply only to
    /// gateway requests into that namespace (§5.3); the gateway decides with
    /// them together with [`Repository::cluster_roles`]. A binding to a
    /// missing role grants nothing.
    pub async fn namespace_roles(&self, namespace: &str, user: &str) -> Result<Vec<Role>> {
        let (bindings, _) = self.list_all::<RoleBinding>(Collection::NamespaceRoleBindings(namespace)).await?;
        let names: BTreeSet<String> =
            bindings.into_iter().filter(|b| b.value.user == user).map(|b| b.value.role).collect();
        let mut roles = Vec::new();
        for name in names {
            if let Some(role) = self.get::<Role>(RecordRef::Role(&name)).await? {
                roles.push(role.value);
            }
        }
        Ok(roles)
    }

    /// Platform contract §5.4, idempotently: role `sysadmin` grants
    /// everything, user `admin` exists, binding `admin-sysadmin` binds them,
    /// and `token` authenticates as `admin`. Objects an operator created are
    /// kept; only what is missing or would break the admin's access (a
    /// sysadmin role without the everything rule, a rebound binding) is
    /// repaired, so the bootstrap token always works as a break-glass.
    pub async fn bootstrap_admin(&self, token: &str) -> Result<()> {
        let role = Role { name: BOOTSTRAP_ROLE.into(), rules: vec![everything()] };
        self.ensure(&keys::role(BOOTSTRAP_ROLE), &role, |r: &mut Role| {
            if r.rules.contains(&everything()) {
                Change::Keep
            } else {
                r.rules.push(everything());
                Change::Write
            }
        })
        .await?;
        let user = User { name: BOOTSTRAP_USER.into(), description: "bootstrap administrator".into() };
        self.ensure(&keys::user(BOOTSTRAP_USER), &user, |_: &mut User| Change::Keep).await?;
        let binding = ClusterRoleBinding {
            name: BOOTSTRAP_BINDING.into(),
            role: BOOTSTRAP_ROLE.into(),
            user: BOOTSTRAP_USER.into(),
        };
        self.ensure(&keys::cluster_role_binding(BOOTSTRAP_BINDING), &binding, |b: &mut ClusterRoleBinding| {
            if b.role == BOOTSTRAP_ROLE && b.user == BOOTSTRAP_USER {
                Change::Keep
            } else {
                b.role = BOOTSTRAP_ROLE.into();
                b.user = BOOTSTRAP_USER.into();
                Change::Write
            }
        })
        .await?;
        self.store_token(BOOTSTRAP_USER, token).await?;
        self.replace_bootstrap_token(&hash_token(token)).await
    }

    /// Records `hash` as the bootstrap token and revokes the previous
    /// bootstrap token of `admin` (only that one) when it differs (§5.4).
    async fn replace_bootstrap_token(&self, hash: &str) -> Result<()> {
        for _ in 0..GUARDED_ATTEMPTS {
            let previous = self.get_key::<String>(keys::BOOTSTRAP_TOKEN).await?;
            let mut txn = Txn::new().then(Op::Put { key: keys::BOOTSTRAP_TOKEN.into(), value: encode(&hash) });
            match &previous {
                Some(p) if p.value == hash => return Ok(()),
                Some(p) => {
                    txn = txn.when(Compare::ModRevision(keys::BOOTSTRAP_TOKEN.into(), p.revision));
                    let old = keys::token(&p.value);
                    // Revoked only while it still belongs to admin.
                    if let Some(stored) = self.get_key::<TokenRecord>(&old).await?
                        && stored.value.user == BOOTSTRAP_USER
                    {
                        txn = txn
                            .when(Compare::ModRevision(old.clone(), stored.revision))
                            .then(Op::Delete { key: old })
                            .then(Op::Delete { key: keys::user_token(BOOTSTRAP_USER, &p.value) });
                        tracing::info!(id = token_id(&p.value), "revoking the previous bootstrap token");
                    }
                }
                None => txn = txn.when(Compare::Absent(keys::BOOTSTRAP_TOKEN.into())),
            }
            if self.txn(txn).await?.succeeded {
                return Ok(());
            }
        }
        Err(Error::Conflict("the bootstrap token keeps changing; try again".into()))
    }

    /// Creates `value` at `key`, or when it exists lets `repair` fix it up.
    /// Safe against concurrent bootstraps: a lost create race falls through
    /// to the CAS loop.
    async fn ensure<T, F>(&self, key: &str, value: &T, repair: F) -> Result<()>
    where
        T: serde::Serialize + serde::de::DeserializeOwned,
        F: FnMut(&mut T) -> Change<Error>,
    {
        match self.create_key(key, value, key).await {
            Ok(_) => Ok(()),
            Err(Error::Conflict(_)) => self.modify_key(key, key, repair).await.map(|_| ()),
            Err(e) => Err(e),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_are_long_random_and_distinct() {
        let a = generate_token();
        let b = generate_token();
        assert_ne!(a, b);
        // 32 bytes base64url without padding is 43 characters.
        assert_eq!(a.len(), TOKEN_PREFIX.len() + 43);
        assert!(a.starts_with(TOKEN_PREFIX));
    }

    #[test]
    fn ids_are_hash_prefixes() {
        let hash = hash_token("secret");
        // SHA-256 in lowercase hex: the stored hashes of earlier builds match.
        assert_eq!(hash, "2bb80d537b1da3e38bd30361aa855686bde0eacd7162fef6a25fe97bf527a25b");
        assert_eq!(token_id(&hash), &hash[..16]);
        assert_eq!(hash, hash_token("secret"));
        assert_ne!(hash, hash_token("secret2"));
    }

    #[test]
    fn issued_token_debug_hides_the_secret() {
        let t = IssuedToken { id: "abc".into(), token: "kayra_supersecret".into(), created_at: "now".into() };
        assert!(!format!("{t:?}").contains("supersecret"));
    }
}
