//! Backups (`kayra export`, `kayra import`; platform §15): every record of
//! this deployment's catalog read at one store revision, and the
//! conditional bulk create that writes them into a store holding none of
//! them.
//!
//! What a backup holds: namespaces, users, tokens (hashes, never a
//! secret), roles, cluster role bindings, role bindings, the bootstrap
//! token's hash, and this deployment's registrations and subscriptions,
//! computed fields included. Not in it: run records and run cursors
//! (history), the reconciler's given-up attempt records (they name store
//! revisions, which mean nothing in another store), job locks and limit
//! records (leased, live state). See `docs/decisions.md`.
//!
//! The import writes each record exactly as the Repository's own creates
//! write it, guard and index keys included ([`Record::writes`] is the one
//! place that lists them for a backup, and a test compares its result key
//! for key with what the API's creates leave behind), in transactions
//! whose every written key is compared absent (etcd: `create_revision ==
//! 0`), at most [`MAX_TXN_KEYS`] keys each (etcd's default
//! `--max-txn-ops` is 128). A record that appears between the check and
//! the write fails its batch: nothing is overwritten, and the batches
//! already written are deleted again.

use kayra_core::{ApiRegistration, ClusterRoleBinding, Namespace, Role, RoleBinding, Subscription, TokenRecord, User};
use kayra_store::{Compare, KeyValue, Op, Revision, Txn};
use serde::de::DeserializeOwned;

use super::{Collection, Error, Repository, Result, decode, encode, keys};

/// The most keys one import transaction compares or writes (each under
/// etcd's default `--max-txn-ops` of 128).
pub const MAX_TXN_KEYS: usize = 120;

/// One record of a backup, as stored (computed fields included).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Record {
    Namespace(Namespace),
    User(User),
    /// A user's token: its hash, id and creation time (never the token).
    Token(TokenRecord),
    Role(Role),
    Registration(ApiRegistration),
    ClusterRoleBinding(ClusterRoleBinding),
    RoleBinding(RoleBinding),
    Subscription(Subscription),
    /// The hash of the token the last bootstrap installed (§5.4), so a
    /// start with another bootstrap token revokes exactly that one.
    BootstrapToken(String),
}

impl Record {
    /// Where the record goes in an import: what it refers to comes first
    /// (namespaces before their bindings and subscriptions, users before
    /// their tokens, registrations before their subscriptions).
    pub fn rank(&self) -> u8 {
        match self {
            Record::Namespace(_) => 0,
            Record::User(_) => 1,
            Record::Token(_) => 2,
            Record::BootstrapToken(_) => 3,
            Record::Role(_) => 4,
            Record::Registration(_) => 5,
            Record::ClusterRoleBinding(_) => 6,
            Record::RoleBinding(_) => 7,
            Record::Subscription(_) => 8,
        }
    }

    /// The record in words, for messages (`namespace "core"`).
    pub fn describe(&self) -> String {
        match self {
            Record::Namespace(n) => format!("namespace {:?}", n.name),
            Record::User(u) => format!("user {:?}", u.name),
            Record::Token(t) => format!("token {:?} of user {:?}", t.id, t.user),
            Record::Role(r) => format!("role {:?}", r.name),
            Record::Registration(r) => format!("api registration {:?}", r.name),
            Record::ClusterRoleBinding(b) => format!("cluster role binding {:?}", b.name),
            Record::RoleBinding(b) => format!("role binding {:?} in namespace {:?}", b.name, b.namespace),
            Record::Subscription(s) => format!("subscription of namespace {:?} to {:?}", s.namespace, s.api),
            Record::BootstrapToken(_) => "the bootstrap token record".into(),
        }
    }
}

/// The keys one record's import writes, and the keys it only requires absent.
struct Writes {
    /// `(key, value, what an existing key means)`, the record's own key first.
    puts: Vec<(String, Vec<u8>, String)>,
    /// Keys that must not exist although the import does not write them
    /// (a registration's name must not be another's short name, and its
    /// short name not another's name), with what an existing one means.
    absent: Vec<(String, String)>,
}

impl Writes {
    fn keys(&self) -> impl Iterator<Item = (&str, &str)> {
        self.puts
            .iter()
            .map(|(k, _, what)| (k.as_str(), what.as_str()))
            .chain(self.absent.iter().map(|(k, w)| (k.as_str(), w.as_str())))
    }
    fn len(&self) -> usize {
        self.puts.len() + self.absent.len()
    }
}

/// What [`Repository::export`] read.
#[derive(Debug, Clone)]
pub struct Backup {
    /// In import order ([`Record::rank`]), each kind sorted by key.
    pub records: Vec<Record>,
    /// The one store revision every record was read at.
    pub revision: Revision,
}

/// What [`Repository::import`] wrote.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Imported {
    pub records: usize,
    /// Store transactions it took.
    pub transactions: usize,
}

impl Repository {
    /// Every record of a backup (see the module docs), all read at ONE
    /// store revision (etcd: every range at the first one's revision;
    /// local: one read transaction).
    pub async fn export(&self) -> Result<Backup> {
        let prefixes = [
            self.base.layout.prefix(Collection::Namespaces),
            self.base.layout.prefix(Collection::Users),
            self.base.layout.prefix(Collection::Tokens),
            keys::BOOTSTRAP_TOKEN.to_string(),
            self.base.layout.prefix(Collection::Roles),
            self.base.layout.prefix(Collection::Registrations),
            self.base.layout.prefix(Collection::ClusterRoleBindings),
            self.base.layout.prefix(Collection::RoleBindings),
            self.base.layout.prefix(Collection::Subscriptions),
        ];
        let (lists, revision) = self.base.store.snapshot_many(&prefixes).await?;
        let mut lists = lists.into_iter();
        let mut next = || lists.next().unwrap_or_default();
        fn all<T: DeserializeOwned>(kvs: Vec<KeyValue>) -> Result<Vec<T>> {
            kvs.iter().map(|kv| decode::<T>(kv).map(|v| v.value)).collect()
        }
        let mut records = Vec::new();
        records.extend(all::<Namespace>(next())?.into_iter().map(Record::Namespace));
        let users = all::<User>(next())?;
        let tokens = all::<TokenRecord>(next())?;
        // A token whose user is gone authenticates nobody: not exported.
        let tokens = tokens.into_iter().filter(|t| users.iter().any(|u| u.name == t.user));
        records.extend(users.iter().cloned().map(Record::User));
        records.extend(tokens.map(Record::Token));
        // Exactly the key `/bootstraptoken` (the prefix read may hold longer keys).
        let bootstrap = next().into_iter().find(|kv| kv.key == keys::BOOTSTRAP_TOKEN);
        records.extend(bootstrap.map(|kv| decode::<String>(&kv).map(|v| Record::BootstrapToken(v.value))).transpose()?);
        records.extend(all::<Role>(next())?.into_iter().map(Record::Role));
        records.extend(all::<ApiRegistration>(next())?.into_iter().map(Record::Registration));
        records.extend(all::<ClusterRoleBinding>(next())?.into_iter().map(Record::ClusterRoleBinding));
        records.extend(all::<RoleBinding>(next())?.into_iter().map(Record::RoleBinding));
        records.extend(all::<Subscription>(next())?.into_iter().map(Record::Subscription));
        Ok(Backup { records, revision })
    }

    /// What the import of `record` writes: its key and the guard and index
    /// keys the Repository's create of it writes beside it (the same
    /// values), and the keys that create requires absent.
    fn writes(&self, record: &Record) -> Writes {
        let (p, r) = (&*self.base.platform, &*self.base.region);
        let what = record.describe();
        let mut puts = Vec::new();
        let mut absent = Vec::new();
        match record {
            Record::Namespace(n) => puts.push((keys::namespace(&n.name), encode(n), what)),
            Record::User(u) => puts.push((keys::user(&u.name), encode(u), what)),
            Record::Token(t) => {
                // As `store_token`: the token by hash, and its index under the user.
                let key = keys::token(&t.hash);
                puts.push((key.clone(), encode(t), what.clone()));
                puts.push((keys::user_token(&t.user, &t.hash), encode(&key), what));
            }
            Record::BootstrapToken(hash) => puts.push((keys::BOOTSTRAP_TOKEN.into(), encode(hash), what)),
            Record::Role(role) => puts.push((keys::role(&role.name), encode(role), what)),
            Record::Registration(reg) => {
                // As `create_registration`: the short-name claim with it.
                puts.push((keys::registration(p, r, &reg.name), encode(reg), what.clone()));
                let name_as_short = keys::short_name(p, r, &reg.name);
                absent.push((name_as_short, format!("a registration whose short name is {:?}", reg.name)));
                if !reg.short_name.is_empty() {
                    let claim = format!("the short name {:?} (claimed by {what})", reg.short_name);
                    puts.push((keys::short_name(p, r, &reg.short_name), encode(&reg.name), claim));
                    let short_as_name = keys::registration(p, r, &reg.short_name);
                    absent.push((short_as_name, format!("api registration {:?}", reg.short_name)));
                }
            }
            Record::ClusterRoleBinding(b) => puts.push((keys::cluster_role_binding(&b.name), encode(b), what)),
            Record::RoleBinding(b) => puts.push((keys::role_binding(&b.namespace, &b.name), encode(b), what)),
            Record::Subscription(s) => {
                // As `create_subscription`: both index keys with it.
                let key = keys::subscription(p, r, &s.namespace, &s.api);
                puts.push((key.clone(), encode(s), what.clone()));
                puts.push((keys::subscriber(p, r, &s.api, &s.namespace), encode(&key), what.clone()));
                puts.push((keys::namespace_subscriber(&s.namespace, p, r, &s.api), encode(&key), what));
            }
        }
        Writes { puts, absent }
    }

    /// The first of `records` (in import order) the store already holds,
    /// or whose guard keys it holds, in words; `None` when it holds none.
    /// Reads only.
    pub async fn import_conflict(&self, records: &[Record]) -> Result<Option<String>> {
        let writes: Vec<Writes> = ordered(records).iter().map(|r| self.writes(r)).collect();
        let keys: Vec<(&str, &str)> = writes.iter().flat_map(Writes::keys).collect();
        for chunk in keys.chunks(MAX_TXN_KEYS) {
            let txn = chunk.iter().fold(Txn::new(), |txn, (key, _)| txn.then(Op::Get { key: key.to_string() }));
            let resp = self.base.store.txn(txn).await?;
            if let Some(((_, what), _)) = chunk.iter().zip(&resp.gets).find(|(_, got)| got.is_some()) {
                return Ok(Some(what.to_string()));
            }
        }
        Ok(None)
    }

    /// Writes `records` (in import order, whatever order they come in)
    /// into a store that holds none of them: refused with
    /// `Error::Conflict` naming one it holds, writing nothing. Every
    /// transaction compares each key it writes absent, so a record created
    /// concurrently fails the import rather than being overwritten; the
    /// batches already written are then deleted again (each key only while
    /// it is still as the import wrote it).
    pub async fn import(&self, records: &[Record]) -> Result<Imported> {
        if let Some(what) = self.import_conflict(records).await? {
            return Err(Error::Conflict(format!("the target store already holds {what}")));
        }
        self.import_unchecked(records).await
    }

    /// [`Repository::import`] without its read-only check first: the
    /// compares alone keep existing records (tests of the concurrent case).
    #[doc(hidden)]
    pub async fn import_unchecked(&self, records: &[Record]) -> Result<Imported> {
        let ordered = ordered(records);
        let mut batches: Vec<Vec<Writes>> = vec![Vec::new()];
        for record in &ordered {
            let writes = self.writes(record);
            let current = batches.last_mut().expect("at least one batch");
            if !current.is_empty() && current.iter().map(Writes::len).sum::<usize>() + writes.len() > MAX_TXN_KEYS {
                batches.push(Vec::new());
            }
            batches.last_mut().expect("at least one batch").push(writes);
        }
        let mut written: Vec<(Vec<String>, Revision)> = Vec::new();
        for batch in batches.iter().filter(|b| !b.is_empty()) {
            let mut txn = Txn::new();
            for writes in batch {
                for (key, _) in writes.keys() {
                    txn = txn.when(Compare::Absent(key.to_string())).otherwise(Op::Get { key: key.to_string() });
                }
                for (key, value, _) in &writes.puts {
                    txn = txn.then(Op::Put { key: key.clone(), value: value.clone() });
                }
            }
            let resp = self.txn(txn).await?;
            if !resp.succeeded {
                let taken = batch.iter().flat_map(Writes::keys).zip(&resp.gets).find(|(_, got)| got.is_some());
                let what = taken.map(|((_, what), _)| what.to_string()).unwrap_or_else(|| "a record".into());
                let undone = self.undo_import(&written).await;
                let undone = match undone {
                    Ok(()) => "nothing was imported".to_string(),
                    Err(e) => format!("the records imported before it could not all be removed again: {e}"),
                };
                return Err(Error::Conflict(format!(
                    "{what} was created in the target store during the import; {undone}"
                )));
            }
            let keys = batch.iter().flat_map(|w| w.puts.iter().map(|(k, _, _)| k.clone())).collect();
            written.push((keys, resp.revision));
        }
        Ok(Imported { records: ordered.len(), transactions: written.len() })
    }

    /// Deletes the keys of the batches an import wrote, each only while it
    /// is still as that batch left it (not modified after the batch's
    /// revision).
    async fn undo_import(&self, written: &[(Vec<String>, Revision)]) -> Result<()> {
        for (keys, revision) in written {
            for chunk in keys.chunks(MAX_TXN_KEYS) {
                let read = chunk.iter().fold(Txn::new(), |txn, key| txn.then(Op::Get { key: key.clone() }));
                let resp = self.base.store.txn(read).await?;
                let mut undo = Txn::new();
                for kv in resp.gets.iter().flatten().filter(|kv| kv.mod_revision <= *revision) {
                    undo = undo
                        .when(Compare::ModRevision(kv.key.clone(), kv.mod_revision))
                        .then(Op::Delete { key: kv.key.clone() });
                }
                if !undo.success.is_empty() && !self.txn(undo).await?.succeeded {
                    return Err(Error::Conflict("they changed meanwhile".into()));
                }
            }
        }
        Ok(())
    }
}

/// `records` in import order ([`Record::rank`]; stable within a kind).
fn ordered(records: &[Record]) -> Vec<&Record> {
    let mut ordered: Vec<&Record> = records.iter().collect();
    ordered.sort_by_key(|r| r.rank());
    ordered
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use kayra_store::Store;

    use super::*;
    use crate::repo::RecordRef;

    async fn local_repo(dir: &std::path::Path) -> Repository {
        let config = kayra_config::DatabaseConfig::local(kayra_testkit::local_config(dir));
        Repository::new(Store::open(&config).await.unwrap(), "dev", "local")
    }

    /// Every key and value in the store (revisions aside).
    async fn contents(repo: &Repository) -> BTreeMap<String, Vec<u8>> {
        let (all, _) = repo.store().list_all("/").await.unwrap();
        all.into_iter().map(|kv| (kv.key, kv.value)).collect()
    }

    /// A catalog written through the Repository's own creates (as the API does).
    async fn seed(repo: &Repository) {
        let ns = Namespace { name: "core".into(), description: "d".into(), ..Namespace::default() };
        repo.create(RecordRef::Namespace("core"), &ns, "namespace").await.unwrap();
        repo.create(RecordRef::User("alice"), &User { name: "alice".into(), description: String::new() }, "user")
            .await
            .unwrap();
        repo.issue_token("alice").await.unwrap();
        repo.bootstrap_admin("kayra_bootstrap").await.unwrap();
        let reg = ApiRegistration {
            name: "compute.example.com".into(),
            short_name: "compute".into(),
            sync_id: "s1".into(),
            platform: "dev".into(),
            region: "local".into(),
            ..ApiRegistration::default()
        };
        repo.create_registration(&reg).await.unwrap();
        let plain = ApiRegistration { name: "plain.example.com".into(), ..reg.clone() };
        repo.create_registration(&ApiRegistration { short_name: String::new(), ..plain }).await.unwrap();
        let binding =
            RoleBinding { name: "b".into(), namespace: "core".into(), role: "sysadmin".into(), user: "alice".into() };
        repo.create_role_binding(&binding).await.unwrap();
        repo.create_subscription("core", "compute.example.com").await.unwrap().unwrap();
    }

    #[tokio::test]
    async fn an_import_writes_exactly_what_the_creates_wrote() {
        let (a, b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let (source, target) = (local_repo(a.path()).await, local_repo(b.path()).await);
        seed(&source).await;
        let backup = source.export().await.unwrap();
        assert_eq!(backup.revision, source.store().revision().await.unwrap());
        let imported = target.import(&backup.records).await.unwrap();
        assert_eq!(imported.records, backup.records.len());
        assert_eq!(contents(&target).await, contents(&source).await, "records, guards and indexes alike");
        assert_eq!(target.export().await.unwrap().records, backup.records);
    }

    #[tokio::test]
    async fn an_import_into_a_store_holding_one_record_writes_nothing() {
        let (a, b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let (source, target) = (local_repo(a.path()).await, local_repo(b.path()).await);
        seed(&source).await;
        let backup = source.export().await.unwrap();
        // Another registration already holds the short name.
        let squatter =
            ApiRegistration { name: "other.example.com".into(), short_name: "compute".into(), ..Default::default() };
        target.create_registration(&squatter).await.unwrap();
        let before = (contents(&target).await, target.store().revision().await.unwrap());
        let e = target.import(&backup.records).await.unwrap_err();
        assert!(e.to_string().contains("short name \"compute\""), "{e}");
        assert_eq!((contents(&target).await, target.store().revision().await.unwrap()), before);
    }

    #[tokio::test]
    async fn a_record_created_during_the_import_fails_it_and_the_written_batches_go_again() {
        let (a, b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let (source, target) = (local_repo(a.path()).await, local_repo(b.path()).await);
        // More namespaces than one transaction holds, then a subscription.
        for i in 0..(MAX_TXN_KEYS + 10) {
            let name = format!("ns{i:03}");
            let ns = Namespace { name: name.clone(), ..Namespace::default() };
            source.create(RecordRef::Namespace(&name), &ns, "namespace").await.unwrap();
        }
        let backup = source.export().await.unwrap();
        // The check passed (nothing there), then a writer created the last namespace.
        assert_eq!(target.import_conflict(&backup.records).await.unwrap(), None);
        let last = format!("ns{:03}", MAX_TXN_KEYS + 9);
        let theirs = Namespace { name: last.clone(), description: "theirs".into(), ..Namespace::default() };
        target.create(RecordRef::Namespace(&last), &theirs, "namespace").await.unwrap();
        let before = contents(&target).await;
        let e = target.import_unchecked(&backup.records).await.unwrap_err();
        assert!(matches!(e, Error::Conflict(_)) && e.to_string().contains(&last), "{e}");
        assert!(e.to_string().contains("nothing was imported"), "{e}");
        assert_eq!(contents(&target).await, before, "theirs kept, the first batch removed again");
    }
}
