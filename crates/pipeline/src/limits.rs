//! Per-mode limits on pipeline runs (platform §7, `reconciler.limits`).
//!
//! - `max_in_flight`: a counting semaphore. On etcd, N slot records
//!   ([`LimitKey::Slot`]), each created if absent
//!   and bound to the process's session lease: a killed process's slots
//!   vanish when its lease expires (within `lock_ttl`). On the local store,
//!   a counter in the process.
//! - `per_minute`: at most M starts in any window (60 s; shorter in tests).
//!   On etcd, M start records ([`LimitKey::Start`]), each bound to a lease of
//!   the window's length, so a start occupies its key for a whole window;
//!   on the local store, the process's own start times.
//! - a 429 with `Retry-After` ([`Limits::backoff`]): no new start of the
//!   mode before the deadline, at most `max_retry_after` (default 5 min)
//!   away; on etcd the deadline is also a record ([`LimitKey::Backoff`]),
//!   read by every process. The capped deadline is what is stored, so no
//!   process is held past the cap. A hold that begins is one warning line
//!   (mode, api, namespace, until); `kayra_limit_held_seconds{mode}` shows
//!   the time left (0 when not held), from every process on etcd.
//!
//! Where those records live is not the pipeline's business: the store's key
//! layout belongs to the catalog's Repository, which implements
//! [`LimitKeys`] for its deployment (`kayra_catalog::repo::Layout`).
//!
//! [`Limits::try_acquire`] never waits: it answers a permit or "ask again
//! after", so a reconciler can park the job in its queue instead of holding
//! a pool slot. A [`LimitPermit`] gives its slot back when dropped, panics
//! included. Modes without limits cost no store call on the local store and,
//! on etcd, one read of the backoff key per mode per 500 ms (not per start).
//!
//! `kayra_limit_in_flight{mode}` is the mode's pipelines running now. On
//! etcd, for a mode with `max_in_flight`, it is the fleet's: the live slot
//! keys, counted from a watch of the limiter's prefix ([`Limits::report_fleet`])
//! so a scrape costs no store call and every process shows the same number,
//! a killed process's slots included until its lease expires. Otherwise (the
//! local store, or a mode with only `per_minute`, which has no slot keys) it
//! is this process's permits.
//!
//! [`Limits::report_fleet`] also keeps `kayra_limit_held_seconds` current:
//! every [`HELD_REFRESH`], and on etcd at once when any process's hold
//! reaches the watch.

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use futures::StreamExt;
use kayra_config::{ModeLimits, ReconcilerConfig};
use kayra_store::{Leases, Store, WatcherEvent};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

const GAUGE: &str = "kayra_limit_in_flight";
const HELD_GAUGE: &str = "kayra_limit_held_seconds";
/// How often `kayra_limit_held_seconds` counts down.
const HELD_REFRESH: Duration = Duration::from_millis(250);
/// How long an unlimited mode's reading of the fleet's backoff key is
/// reused: another process's 429 reaches this one within it, and a
/// fan-out pays one read per mode per interval, not one per start.
const FLEET_BACKOFF_REFRESH: Duration = Duration::from_millis(500);
/// How soon to ask again when every `max_in_flight` slot is taken.
const FULL_RETRY: Duration = Duration::from_millis(100);

/// One limit record of a mode.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LimitKey<'a> {
    /// One of the mode's `max_in_flight` slots, bound to its holder's session lease.
    Slot { mode: &'a str, index: usize },
    /// One of the mode's `per_minute` starts, bound to a lease of the window's length.
    Start { mode: &'a str, index: usize },
    /// The deadline of the mode's fleet-wide backoff (a 429's `Retry-After`).
    Backoff { mode: &'a str },
}

/// The store keys of one deployment's limit records: spelt and parsed by
/// whoever owns the store's key layout (the catalog's Repository).
pub trait LimitKeys: Send + Sync + 'static {
    /// The prefix of every limit record of the deployment.
    fn all_limits(&self) -> String;
    /// The prefix of one mode's limit records.
    fn mode_limits(&self, mode: &str) -> String;
    /// The store key of `record`.
    fn limit_key(&self, record: LimitKey<'_>) -> String;
    /// Which limit record `key` is, when it is one.
    fn parse_limit_key<'k>(&self, key: &'k str) -> Option<LimitKey<'k>>;
}

/// Whose step was answered `429`: named in the warning line of the hold.
#[derive(Debug, Clone, Copy)]
pub struct HoldCause<'a> {
    pub api: &'a str,
    pub namespace: &'a str,
}

/// The limits of every mode, for one process.
#[derive(Clone)]
pub struct Limits {
    inner: Arc<Inner>,
}

struct Inner {
    modes: BTreeMap<String, ModeLimits>,
    /// The modes whose `kayra_limit_held_seconds` is shown: every mode
    /// with limits or steps.
    held_modes: BTreeSet<String>,
    store: Store,
    leases: Option<Arc<dyn Leases>>,
    /// Where the limit records live.
    keys: Box<dyn LimitKeys>,
    window: Duration,
    local: Mutex<HashMap<String, ModeState>>,
    /// One [`Limits::backoff`] at a time, so that of several 429s at once
    /// the first records the hold (and warns) before the others look.
    backoffs: tokio::sync::Mutex<()>,
}

#[derive(Default)]
struct ModeState {
    /// Permits held by this process.
    held: usize,
    /// Start times in the current window (local store only).
    starts: VecDeque<Instant>,
    /// The end of the mode's hold as this process knows it: its own 429s
    /// and, on etcd, the fleet's backoff record as last seen.
    backoff_until: Option<Instant>,
    /// An unlimited mode on etcd: when the fleet's backoff key was last
    /// read, and the deadline it held.
    fleet_backoff: Option<(Instant, Option<Instant>)>,
    /// Whose turn it is to start (limited modes).
    turns: Turns,
}

/// How long past the wait it was given a refused namespace's claim to the
/// next start lasts: a job that does not come back (its subscription was
/// deleted, it found nothing to do) stops holding the others back.
const CLAIM_GRACE: Duration = Duration::from_secs(5);
/// Past this many namespaces remembered, those that last started longer
/// than [`FORGET_AFTER`] ago are forgotten (as if they never started,
/// which only puts them first).
const REMEMBERED: usize = 1024;
const FORGET_AFTER: Duration = Duration::from_secs(600);

/// Round-robin starts of one limited mode across namespaces (§17), in this
/// process: a namespace refused a start waits its turn, and a namespace
/// asking yields while another one waits that started less recently (or
/// never). So while several namespaces wait, none gets a second start
/// before each of the others got one, however often it asks, and one
/// tenant re-syncing in a loop cannot keep another's first sync waiting.
/// With several reconcilers each keeps its own turns: the fleet-wide limit
/// is shared through the store, the order within each process.
#[derive(Debug, Default)]
struct Turns {
    /// Namespaces refused a start and not started since, with when their
    /// claim lapses.
    waiting: HashMap<String, Instant>,
    /// When each namespace last started.
    last_start: HashMap<String, Instant>,
    /// When the limit is next likely to let a start through (its last
    /// refusal's wait).
    next_free: Option<Instant>,
}

impl Turns {
    /// How long `namespace` waits for another namespace's turn, if it must.
    fn must_yield(&mut self, namespace: &str, now: Instant) -> Option<Duration> {
        self.waiting.retain(|_, lapses| *lapses > now);
        let mine = self.last_start.get(namespace);
        let before_me = |other: &String| {
            other != namespace
                && match (self.last_start.get(other), mine) {
                    (None, None) => false,
                    (None, Some(_)) => true,
                    (Some(theirs), Some(mine)) => theirs < mine,
                    (Some(_), None) => false,
                }
        };
        if !self.waiting.keys().any(before_me) {
            return None;
        }
        self.waiting.entry(namespace.to_string()).or_insert(now + FULL_RETRY + CLAIM_GRACE);
        // Back a little after the limit frees, so the namespace whose turn
        // it is asks first.
        let free = self.next_free.map_or(Duration::ZERO, |at| at.saturating_duration_since(now));
        Some(free + FULL_RETRY)
    }

    fn refused(&mut self, namespace: &str, wait: Duration, now: Instant) {
        self.waiting.insert(namespace.to_string(), now + wait + CLAIM_GRACE);
        self.next_free = Some(now + wait);
    }

    fn started(&mut self, namespace: &str, now: Instant) {
        self.waiting.remove(namespace);
        if self.last_start.len() >= REMEMBERED {
            self.last_start.retain(|_, at| now.saturating_duration_since(*at) < FORGET_AFTER);
        }
        self.last_start.insert(namespace.to_string(), now);
    }
}

/// A running pipeline's share of its mode's limits; released on drop.
pub struct LimitPermit {
    inner: Option<Arc<Inner>>,
    mode: String,
    /// The etcd slot key and its revision, deleted on release.
    slot: Option<(String, i64)>,
}

impl std::fmt::Debug for LimitPermit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LimitPermit").field("mode", &self.mode).field("slot", &self.slot).finish()
    }
}

impl Drop for LimitPermit {
    fn drop(&mut self) {
        let Some(inner) = self.inner.take() else { return };
        inner.held(&self.mode, |held| *held = held.saturating_sub(1));
        if let Some((key, revision)) = self.slot.take() {
            let store = inner.store.clone();
            // The delete is async; without a runtime (process exit) the
            // session lease frees the slot instead.
            if let Ok(runtime) = tokio::runtime::Handle::try_current() {
                runtime.spawn(async move {
                    if let Err(e) = store.delete(&key, Some(revision)).await {
                        tracing::warn!(%key, error = %e, "limit slot not released; it goes with the session lease");
                    }
                });
            }
        }
    }
}

fn unix_ms(at: SystemTime) -> u64 {
    u64::try_from(at.duration_since(UNIX_EPOCH).unwrap_or_default().as_millis()).unwrap_or(u64::MAX)
}

impl Limits {
    /// Limits of `cfg.limits` over `store`, with their records at `keys`
    /// (the deployment's).
    pub fn new(cfg: &ReconcilerConfig, store: Store, keys: impl LimitKeys) -> Self {
        metrics::describe_gauge!(
            GAUGE,
            "Pipelines of a limited mode running now (reconciler.limits): on etcd, for a mode with max_in_flight, \
             across the fleet (live slot keys); otherwise this process's"
        );
        metrics::describe_gauge!(
            HELD_GAUGE,
            "Seconds left before a new run of the mode may start, after a backend's 429 with Retry-After \
             (at most reconciler.limits.<mode>.max_retry_after); 0 when not held; on etcd, the fleet's hold"
        );
        for mode in cfg.limits.keys() {
            metrics::gauge!(GAUGE, "mode" => mode.clone()).set(0.0);
        }
        let held_modes: BTreeSet<String> = cfg.limits.keys().chain(cfg.mode.keys()).cloned().collect();
        for mode in &held_modes {
            metrics::gauge!(HELD_GAUGE, "mode" => mode.clone()).set(0.0);
        }
        let leases = store.leases();
        let inner = Inner {
            modes: cfg.limits.clone(),
            held_modes,
            store,
            leases,
            keys: Box::new(keys),
            window: Duration::from_secs(60),
            local: Mutex::new(HashMap::new()),
            backoffs: tokio::sync::Mutex::new(()),
        };
        Self { inner: Arc::new(inner) }
    }

    /// The `per_minute` window; 60 s unless a test shortens it.
    pub fn with_window(self, window: Duration) -> Self {
        let inner = Arc::try_unwrap(self.inner).unwrap_or_else(|_| panic!("with_window before the limits are shared"));
        Self { inner: Arc::new(Inner { window, ..inner }) }
    }

    /// A permit to start a pipeline of `mode` for a subscription of
    /// `namespace` now, or how long to wait before asking again. Never
    /// blocks on the limit itself.
    ///
    /// A limited mode's starts go round-robin across namespaces (§17, see
    /// [`Turns`]): while another namespace waits that started less
    /// recently than `namespace` (or never), `namespace` waits too.
    pub async fn try_acquire(
        &self,
        mode: &str,
        namespace: &str,
    ) -> Result<Result<LimitPermit, Duration>, kayra_store::Error> {
        let inner = &self.inner;
        if !inner.modes.contains_key(mode) {
            return self.acquire(mode).await;
        }
        let now = Instant::now();
        if let Some(wait) = inner.turns(mode, |turns| turns.must_yield(namespace, now)) {
            return Ok(Err(wait));
        }
        let acquired = self.acquire(mode).await;
        match &acquired {
            Ok(Ok(_)) => inner.turns(mode, |turns| turns.started(namespace, now)),
            Ok(Err(wait)) => inner.turns(mode, |turns| turns.refused(namespace, *wait, now)),
            Err(_) => {}
        }
        acquired
    }

    /// [`Limits::try_acquire`] without the turns.
    async fn acquire(&self, mode: &str) -> Result<Result<LimitPermit, Duration>, kayra_store::Error> {
        let inner = &self.inner;
        let now = Instant::now();
        if let Some(wait) = inner.local_backoff(mode, now) {
            return Ok(Err(wait));
        }
        let limits = inner.modes.get(mode).cloned().unwrap_or_default();
        let unlimited = limits.max_in_flight.is_none() && limits.per_minute.is_none();
        let permit = |slot| LimitPermit { inner: Some(inner.clone()), mode: mode.to_string(), slot };
        let Some(leases) = &inner.leases else {
            if unlimited {
                return Ok(Ok(LimitPermit { inner: None, mode: mode.to_string(), slot: None }));
            }
            return Ok(inner.acquire_local(mode, &limits, now).map(|()| permit(None)));
        };
        let prefix = inner.keys.mode_limits(mode);
        if unlimited {
            if let Some(wait) = inner.fleet_backoff(mode, now).await? {
                return Ok(Err(wait));
            }
            return Ok(Ok(LimitPermit { inner: None, mode: mode.to_string(), slot: None }));
        }
        let (keys, _) = inner.store.list_all(&prefix).await?;
        let mut slots = BTreeSet::new();
        let mut starts = BTreeMap::new();
        for kv in &keys {
            match inner.keys.parse_limit_key(&kv.key) {
                Some(LimitKey::Backoff { .. }) => {
                    if let Some(wait) = remaining(&kv.value) {
                        inner.note_hold(mode, now + wait);
                        return Ok(Err(wait));
                    }
                }
                Some(LimitKey::Slot { index, .. }) => {
                    slots.insert(index);
                }
                Some(LimitKey::Start { index, .. }) => {
                    starts.insert(index, String::from_utf8_lossy(&kv.value).parse::<u64>().unwrap_or(0));
                }
                None => {}
            }
        }
        // The in-flight slot first: a start key taken for a run that then
        // finds no slot would waste a start for a whole window.
        let mut slot = None;
        if let Some(max) = limits.max_in_flight {
            let session = leases.session().await?;
            for i in (0..max).filter(|i| !slots.contains(i)) {
                let key = inner.keys.limit_key(LimitKey::Slot { mode, index: i });
                if let Some(revision) = leases.create_leased(&key, Vec::new(), session).await? {
                    slot = Some((key, revision));
                    break;
                }
            }
            if slot.is_none() {
                return Ok(Err(FULL_RETRY));
            }
        }
        // From here on, dropping `held` releases the slot.
        inner.held(mode, |held| *held += 1);
        let held = permit(slot);
        if let Some(max) = limits.per_minute {
            let window_ms = u64::try_from(inner.window.as_millis()).unwrap_or(u64::MAX);
            let now_ms = unix_ms(SystemTime::now());
            let ask_again = |starts: &BTreeMap<usize, u64>| {
                let oldest = starts.values().min().copied().unwrap_or(now_ms);
                Duration::from_millis((oldest + window_ms).saturating_sub(now_ms).max(100))
            };
            let free: Vec<usize> = (0..max).filter(|i| !starts.contains_key(i)).collect();
            if free.is_empty() {
                return Ok(Err(ask_again(&starts)));
            }
            let lease = leases.grant(inner.window).await?;
            let mut taken = false;
            for i in free {
                let key = inner.keys.limit_key(LimitKey::Start { mode, index: i });
                if leases.create_leased(&key, now_ms.to_string().into_bytes(), lease).await?.is_some() {
                    taken = true;
                    break;
                }
            }
            if !taken {
                return Ok(Err(ask_again(&starts)));
            }
        }
        Ok(Ok(held))
    }

    /// Until `cancel`: counts `kayra_limit_held_seconds` down every
    /// [`HELD_REFRESH`]; on etcd, also keeps `kayra_limit_in_flight` of
    /// every mode with `max_in_flight` at the fleet's count of live slot
    /// keys and learns every process's hold, from a watch of the limiter's
    /// prefix (list, then watch, re-listing after a gap).
    pub async fn report_fleet(self, cancel: CancellationToken) {
        let inner = &self.inner;
        let mut watcher = inner.leases.is_some().then(|| inner.store.watcher(&inner.keys.all_limits()));
        let mut held = tokio::time::interval(HELD_REFRESH);
        held.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut slots = BTreeSet::new();
        let mut listing = BTreeSet::new();
        loop {
            let event = tokio::select! {
                event = async {
                    match &mut watcher {
                        Some(watcher) => watcher.next().await,
                        None => std::future::pending().await,
                    }
                } => event,
                _ = held.tick() => {
                    inner.publish_held();
                    continue;
                }
                () = cancel.cancelled() => return,
            };
            let Some(event) = event else {
                watcher = None;
                continue;
            };
            match event {
                WatcherEvent::Init => listing.clear(),
                WatcherEvent::InitApply(kv) => {
                    inner.note_fleet_hold(&kv.key, &kv.value);
                    listing.insert(kv.key);
                }
                WatcherEvent::InitDone { .. } => {
                    slots = std::mem::take(&mut listing);
                    inner.publish_fleet(&slots);
                }
                WatcherEvent::Apply(kv) => {
                    inner.note_fleet_hold(&kv.key, &kv.value);
                    slots.insert(kv.key);
                    inner.publish_fleet(&slots);
                }
                WatcherEvent::Delete { key, .. } => {
                    slots.remove(&key);
                    inner.publish_fleet(&slots);
                }
                WatcherEvent::Progress { .. } => {}
            }
        }
    }

    /// A step of `mode` (of `cause`'s API and namespace) was answered 429
    /// with `Retry-After`: no new start of the mode before it passes, or
    /// the mode's `max_retry_after` if sooner (fleet-wide on etcd). A hold
    /// that begins here is logged once, as a warning; one that only moves
    /// a current hold's end is an info line.
    pub async fn backoff(
        &self,
        mode: &str,
        retry_after: Duration,
        cause: HoldCause<'_>,
    ) -> Result<(), kayra_store::Error> {
        let inner = &self.inner;
        let _one_at_a_time = inner.backoffs.lock().await;
        let hold = retry_after.min(inner.max_retry_after(mode));
        let now = Instant::now();
        let wall_until = SystemTime::now() + hold;
        let was_held = {
            let mut local = inner.local.lock().unwrap_or_else(PoisonError::into_inner);
            let state = local.entry(mode.to_string()).or_default();
            let was_held = state.backoff_until.is_some_and(|until| until > now);
            state.backoff_until = state.backoff_until.max(Some(now + hold));
            was_held
        };
        let stored = match inner.leases {
            Some(_) => inner.store_backoff(mode, unix_ms(wall_until)).await,
            None => Ok(false),
        };
        inner.publish_held();
        let until = humantime::format_rfc3339_millis(wall_until).to_string();
        let (api, namespace) = (cause.api, cause.namespace);
        if was_held || stored.as_ref().is_ok_and(|fleet_held| *fleet_held) {
            tracing::info!(mode, api, namespace, %until, "backend answered 429: the mode's hold goes on");
        } else {
            tracing::warn!(
                mode,
                api,
                namespace,
                %until,
                retry_after_seconds = retry_after.as_secs(),
                "backend answered 429 with Retry-After: no new run of the mode starts until then"
            );
        }
        stored.map(drop)
    }
}

/// The time left before a backoff key's deadline, if any.
fn remaining(value: &[u8]) -> Option<Duration> {
    let deadline = String::from_utf8_lossy(value).parse::<u64>().ok()?;
    let left = deadline.checked_sub(unix_ms(SystemTime::now()))?;
    (left > 0).then(|| Duration::from_millis(left))
}

impl Inner {
    /// The cap on one 429's hold of `mode`.
    fn max_retry_after(&self, mode: &str) -> Duration {
        self.modes.get(mode).map_or_else(|| ModeLimits::default().max_retry_after(), ModeLimits::max_retry_after)
    }

    /// Moves the fleet's backoff record of `mode` to `deadline` (unix ms)
    /// unless it is already there or later; whether the mode was already
    /// held by it.
    async fn store_backoff(&self, mode: &str, deadline: u64) -> Result<bool, kayra_store::Error> {
        let key = self.keys.limit_key(LimitKey::Backoff { mode });
        let value = deadline.to_string().into_bytes();
        loop {
            let (existing, _) = self.store.get(&key).await?;
            let stored = existing.as_ref().map(|kv| String::from_utf8_lossy(&kv.value).parse::<u64>().unwrap_or(0));
            let held = stored.is_some_and(|stored| stored > unix_ms(SystemTime::now()));
            let result = match (existing, stored) {
                (Some(_), Some(stored)) if stored >= deadline => return Ok(held),
                (Some(kv), _) => self.store.update(&key, value.clone(), kv.mod_revision).await,
                (None, _) => self.store.create(&key, value.clone()).await,
            };
            match result {
                Ok(_) => return Ok(held),
                Err(kayra_store::Error::Conflict(_) | kayra_store::Error::NotFound(_)) => continue,
                Err(e) => return Err(e),
            }
        }
    }

    /// This process learnt that `mode` is held until `until`.
    fn note_hold(&self, mode: &str, until: Instant) {
        {
            let mut local = self.local.lock().unwrap_or_else(PoisonError::into_inner);
            let state = local.entry(mode.to_string()).or_default();
            state.backoff_until = state.backoff_until.max(Some(until));
        }
        self.publish_held();
    }

    /// A limit record seen by the watch: when it is a mode's backoff
    /// record still in the future, that mode is held.
    fn note_fleet_hold(&self, key: &str, value: &[u8]) {
        if let Some(LimitKey::Backoff { mode }) = self.keys.parse_limit_key(key)
            && let Some(wait) = remaining(value)
        {
            self.note_hold(mode, Instant::now() + wait);
        }
    }

    /// Sets `kayra_limit_held_seconds` of every shown mode to the time
    /// left of its hold, 0 when not held.
    fn publish_held(&self) {
        let now = Instant::now();
        let local = self.local.lock().unwrap_or_else(PoisonError::into_inner);
        for mode in &self.held_modes {
            let until = local.get(mode).and_then(|state| state.backoff_until);
            let left = until.map_or(Duration::ZERO, |until| until.saturating_duration_since(now));
            metrics::gauge!(HELD_GAUGE, "mode" => mode.clone()).set(left.as_secs_f64());
        }
    }

    /// Whether the gauge of `mode` shows the fleet's slot keys rather than
    /// this process's permits.
    fn fleet_counted(&self, mode: &str) -> bool {
        self.leases.is_some() && self.modes.get(mode).is_some_and(|l| l.max_in_flight.is_some())
    }

    /// Sets the fleet-counted gauges from the keys of every limit record
    /// (the slot records count).
    fn publish_fleet(&self, keys: &BTreeSet<String>) {
        for mode in self.modes.keys().filter(|mode| self.fleet_counted(mode)) {
            let slot_of_mode = |key: &String| matches!(self.keys.parse_limit_key(key), Some(LimitKey::Slot { mode: m, .. }) if m == mode);
            let live = keys.iter().filter(|key| slot_of_mode(key)).count();
            metrics::gauge!(GAUGE, "mode" => mode.clone()).set(live as f64);
        }
    }

    /// `f` on `mode`'s turns.
    fn turns<R>(&self, mode: &str, f: impl FnOnce(&mut Turns) -> R) -> R {
        let mut local = self.local.lock().unwrap_or_else(PoisonError::into_inner);
        f(&mut local.entry(mode.to_string()).or_default().turns)
    }

    fn held(&self, mode: &str, change: impl FnOnce(&mut usize)) {
        if !self.modes.contains_key(mode) {
            return;
        }
        let mut local = self.local.lock().unwrap_or_else(PoisonError::into_inner);
        let state = local.entry(mode.to_string()).or_default();
        change(&mut state.held);
        if !self.fleet_counted(mode) {
            metrics::gauge!(GAUGE, "mode" => mode.to_string()).set(state.held as f64);
        }
    }

    /// The fleet's backoff of an unlimited `mode` (etcd), read at most
    /// once per [`FLEET_BACKOFF_REFRESH`].
    async fn fleet_backoff(&self, mode: &str, now: Instant) -> Result<Option<Duration>, kayra_store::Error> {
        let cached = {
            let local = self.local.lock().unwrap_or_else(PoisonError::into_inner);
            local.get(mode).and_then(|state| state.fleet_backoff)
        };
        let until = match cached {
            Some((read_at, until)) if now.duration_since(read_at) < FLEET_BACKOFF_REFRESH => until,
            _ => {
                let (backoff, _) = self.store.get(&self.keys.limit_key(LimitKey::Backoff { mode })).await?;
                let until = backoff.and_then(|kv| remaining(&kv.value)).map(|wait| now + wait);
                if let Some(until) = until {
                    self.note_hold(mode, until);
                }
                let mut local = self.local.lock().unwrap_or_else(PoisonError::into_inner);
                local.entry(mode.to_string()).or_default().fleet_backoff = Some((now, until));
                until
            }
        };
        Ok(until.filter(|until| *until > now).map(|until| until - now))
    }

    fn local_backoff(&self, mode: &str, now: Instant) -> Option<Duration> {
        let local = self.local.lock().unwrap_or_else(PoisonError::into_inner);
        let until = local.get(mode)?.backoff_until?;
        (until > now).then(|| until - now)
    }

    /// The local store: everything in this process.
    fn acquire_local(&self, mode: &str, limits: &ModeLimits, now: Instant) -> Result<(), Duration> {
        let mut local = self.local.lock().unwrap_or_else(PoisonError::into_inner);
        let state = local.entry(mode.to_string()).or_default();
        if limits.max_in_flight.is_some_and(|max| state.held >= max) {
            return Err(FULL_RETRY);
        }
        while state.starts.front().is_some_and(|t| now.duration_since(*t) >= self.window) {
            state.starts.pop_front();
        }
        if let Some(max) = limits.per_minute
            && state.starts.len() >= max
        {
            let oldest = state.starts.front().copied().unwrap_or(now);
            return Err((oldest + self.window).saturating_duration_since(now).max(Duration::from_millis(1)));
        }
        if limits.per_minute.is_some() {
            state.starts.push_back(now);
        }
        state.held += 1;
        metrics::gauge!(GAUGE, "mode" => mode.to_string()).set(state.held as f64);
        Ok(())
    }
}
