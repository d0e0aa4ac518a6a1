//! `Store::watcher`: the list → watch → re-list state machine (the model
//! is kube-runtime's `watcher`), written once over any backend's raw
//! change feed ([`Backend::changes`]).
//!
//! - **listing**: read the prefix at one revision `r`
//!   ([`Backend::snapshot_pages`]), emit `Init`, one `InitApply` per key,
//!   `InitDone{r}`, and watch from `r + 1`. A page is read only once the
//!   consumer has taken the one before, so neither the machine nor the
//!   backend ever holds a whole list (a million subscriptions are some
//!   hundred megabytes raw).
//! - **watching**: feed items become `Apply` / `Delete` / `Progress`;
//!   `next` moves past each event.
//! - **resuming**: the feed failed or ended. After a capped back-off the
//!   feed is re-opened from `next`: nothing lost, nothing twice.
//! - A feed that reports its history gone (`Compacted`: an etcd
//!   compaction, a trimmed local change log) goes back to **listing**, so
//!   the consumer, replacing its view at `InitDone`, drops every key
//!   deleted in the gap.
//!
//! The machine holds only a weak reference to the backend: the stream ends
//! when the last [`crate::Store`] handle is dropped, not never. Every
//! backend call is bounded by the store's request timeout, so a hung store
//! shows as missing `Progress`, never as a wedged consumer — except the
//! list as a whole: it takes as long as the prefix is large (a million
//! subscriptions are some hundred megabytes, more than one request
//! timeout's worth on any link), so what bounds it is each of its reads:
//! etcd's snapshot is read a page at a time, each page one request within
//! the timeout (`etcd::cluster`'s failover loop); the local store reads
//! its own file.

use std::collections::VecDeque;
use std::future::Future;
use std::sync::{Arc, Weak};
use std::time::Duration;

use futures::StreamExt;
use futures::stream::{self, BoxStream};

use crate::{Backend, Change, ChangeStream, Error, Event, Result, Revision, SnapshotPages, WatcherEvent};

/// First and longest wait between failed attempts.
const BACKOFF_MIN: Duration = Duration::from_millis(50);
const BACKOFF_MAX: Duration = Duration::from_secs(2);

pub(crate) fn watcher(
    backend: Weak<dyn Backend>,
    prefix: String,
    request_timeout: Duration,
) -> BoxStream<'static, WatcherEvent> {
    let machine = Machine {
        backend,
        prefix,
        request_timeout,
        state: State::List,
        pending: VecDeque::new(),
        backoff: BACKOFF_MIN,
    };
    Box::pin(stream::unfold(machine, |mut machine| async move {
        let event = machine.next_event().await?;
        Some((event, machine))
    }))
}

enum State {
    List,
    /// A list under way: its pages, and the snapshot's revision once a
    /// page has told it.
    Listing {
        pages: SnapshotPages,
        revision: Option<Revision>,
    },
    Watch {
        feed: ChangeStream,
        next: Revision,
    },
    Resume {
        next: Revision,
    },
}

struct Machine {
    backend: Weak<dyn Backend>,
    prefix: String,
    request_timeout: Duration,
    state: State,
    pending: VecDeque<WatcherEvent>,
    backoff: Duration,
}

impl Machine {
    /// The next event; `None` once the store is gone.
    async fn next_event(&mut self) -> Option<WatcherEvent> {
        loop {
            if let Some(event) = self.pending.pop_front() {
                return Some(event);
            }
            let state = std::mem::replace(&mut self.state, State::List);
            self.state = match state {
                State::List => self.list()?,
                State::Listing { pages, revision } => self.listing(pages, revision).await?,
                State::Resume { next } => self.resume(next).await?,
                State::Watch { mut feed, next } => match feed.next().await {
                    Some(Ok(Change::Event(event))) => {
                        self.backoff = BACKOFF_MIN;
                        let next = next.max(event.revision() + 1);
                        self.pending.push_back(match event {
                            Event::Put(kv) => WatcherEvent::Apply(kv),
                            Event::Delete { key, revision } => WatcherEvent::Delete { key, revision },
                        });
                        State::Watch { feed, next }
                    }
                    Some(Ok(Change::Progress(revision))) => {
                        self.backoff = BACKOFF_MIN;
                        self.pending.push_back(WatcherEvent::Progress { revision });
                        State::Watch { feed, next }
                    }
                    Some(Err(Error::Compacted(revision))) => {
                        tracing::warn!(prefix = %self.prefix, next, compacted = revision,
                            "watch position is no longer retained; re-listing");
                        State::List
                    }
                    Some(Err(e)) => {
                        tracing::warn!(prefix = %self.prefix, next, error = %e, "watch failed; resuming");
                        State::Resume { next }
                    }
                    None => {
                        if self.backend.strong_count() == 0 {
                            return None;
                        }
                        State::Resume { next }
                    }
                },
            };
        }
    }

    /// Calls the backend within the request timeout; `None` when it is gone.
    /// (Not a `&self` method: the machine holds a feed that is not `Sync`.)
    fn call<T, F, Fut>(&self, f: F) -> impl Future<Output = Option<Result<T>>> + Send + use<T, F, Fut>
    where
        F: FnOnce(Arc<dyn Backend>, String) -> Fut,
        Fut: Future<Output = Result<T>> + Send,
    {
        let call = self.backend.upgrade().map(|backend| f(backend, self.prefix.clone()));
        let timeout = self.request_timeout;
        async move {
            Some(match tokio::time::timeout(timeout, call?).await {
                Ok(result) => result,
                Err(_) => Err(Error::Unavailable(format!("no answer within {timeout:?}"))),
            })
        }
    }

    async fn pause(&mut self) -> Option<()> {
        tokio::time::sleep(self.backoff).await;
        self.backoff = (self.backoff * 2).min(BACKOFF_MAX);
        (self.backend.strong_count() > 0).then_some(())
    }

    /// Starts a list: `Init`, then its pages as they are read
    /// ([`Machine::listing`]).
    fn list(&mut self) -> Option<State> {
        // Bounded page by page by the backend, not as a whole (module docs).
        let pages = self.backend.upgrade()?.snapshot_pages(self.prefix.clone());
        self.pending.push_back(WatcherEvent::Init);
        Some(State::Listing { pages, revision: None })
    }

    /// The list's next page as `InitApply`s, read only once the consumer
    /// has taken the page before: a list is never held whole here. After
    /// the last page, `InitDone` and the watch from the snapshot's next
    /// revision; a failed page starts the list over (its `Init` tells the
    /// consumer to drop what it gathered).
    async fn listing(&mut self, mut pages: SnapshotPages, revision: Option<Revision>) -> Option<State> {
        match pages.next().await {
            Some(Ok((items, at))) => {
                self.pending.extend(items.into_iter().map(WatcherEvent::InitApply));
                Some(State::Listing { pages, revision: Some(at) })
            }
            Some(Err(e)) => {
                drop(pages);
                tracing::warn!(prefix = %self.prefix, error = %e, retry_in = ?self.backoff, "watch list failed; retrying");
                self.pause().await?;
                Some(State::List)
            }
            None => {
                drop(pages);
                let revision = match revision {
                    Some(revision) => revision,
                    // A backend that answered no page at all: read the
                    // revision the (empty) list is at.
                    None => match self.call(|backend, _| async move { backend.revision().await }).await? {
                        Ok(revision) => revision,
                        Err(e) => {
                            tracing::warn!(prefix = %self.prefix, error = %e, "watch list failed; retrying");
                            self.pause().await?;
                            return Some(State::List);
                        }
                    },
                };
                self.pending.push_back(WatcherEvent::InitDone { revision });
                Some(self.open(revision + 1).await.unwrap_or(State::Resume { next: revision + 1 }))
            }
        }
    }

    async fn resume(&mut self, next: Revision) -> Option<State> {
        self.pause().await?;
        self.open(next).await
    }

    /// Opens the feed at `next`; `None` when the store is gone.
    async fn open(&mut self, next: Revision) -> Option<State> {
        let opened = self.call(|backend, prefix| async move { backend.changes(&prefix, next).await }).await?;
        Some(match opened {
            Ok(feed) => State::Watch { feed, next },
            Err(Error::Compacted(_)) => State::List,
            Err(e) => {
                tracing::warn!(prefix = %self.prefix, next, error = %e, "opening the watch failed; retrying");
                State::Resume { next }
            }
        })
    }
}
