//! The audit trail's API side (platform §13): the request's
//! [`AuditContext`], built where every route's access is enforced
//! ([`super::endpoint`]) and handed to the handlers of changes through
//! [`Audited`]; and `/audit`, the records newest first.
//!
//! Every change route takes its state through [`Audited`]: its Repository
//! carries the request's context, and each write of a change goes through
//! [`Repository::auditing`](crate::repo::Repository::auditing) with the
//! object before and after, so its record rides on the write. A route
//! without the context (a router mounted without the endpoint layer)
//! refuses with 500 rather than change anything unrecorded.

use axum::Json;
use axum::extract::{FromRequestParts, State};
use axum::http::request::Parts;
use axum::http::{HeaderMap, Method, StatusCode};
use kayra_core::AuditRecord;
use kayra_core::audit::{REASON_HEADER, validate_reason};
use kayra_rbac::Verb;
use serde::Deserialize;
use utoipa::IntoParams;

use axum::body::{Body, Bytes};

use super::ApiState;
use super::authz::Caller;
use super::error::{ApiError, ErrorBody};
use super::extract::{Path, Query};
use super::hub::{Hub, StreamPermit};
use super::list::{List, continue_token};
use super::stream::{Framing, Kind, Outbox, Watcher, frame, streaming};
use crate::repo::Collection;
use crate::repo::Repository;
use crate::repo::audit::{AuditContext, AuditFilter};

/// The caller's address as `kayra serve` resolved it (the peer, or the
/// rightmost untrusted address of `X-Forwarded-For` when the peer is a
/// trusted proxy). Put into the request's extensions by the server; made
/// text only when a change records it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClientSource(pub std::net::IpAddr);

/// The audit settings of `kayra serve` (`audit.require_reason`).
#[derive(Debug, Clone, Default)]
pub struct AuditSettings {
    /// Changes to these RBAC resources need `X-Kayra-Reason`.
    pub require_reason: std::sync::Arc<[String]>,
}

/// The status a change route answers on success.
fn success_code(method: &Method) -> u16 {
    match *method {
        Method::POST => 201,
        Method::DELETE => 204,
        _ => 200,
    }
}

/// Whether `method` changes something (the routes that write a record).
pub(crate) fn is_change(method: &Method) -> bool {
    matches!(*method, Method::POST | Method::PUT | Method::PATCH | Method::DELETE)
}

/// The request's reason: its `X-Kayra-Reason`, checked (400 naming the
/// header), and required for the resources of `audit.require_reason`.
fn reason(headers: &HeaderMap, resource: &str, settings: &AuditSettings) -> Result<String, ApiError> {
    let mut values = headers.get_all(REASON_HEADER).iter();
    let reason = match (values.next(), values.next()) {
        (None, _) => String::new(),
        (Some(_), Some(_)) => {
            return Err(ApiError::bad_request(format!("header {REASON_HEADER} must be given at most once")));
        }
        (Some(value), None) => {
            let text = std::str::from_utf8(value.as_bytes())
                .map_err(|_| ApiError::bad_request(format!("header {REASON_HEADER} must be UTF-8 text")))?;
            validate_reason(text).map_err(|e| ApiError::bad_request(e.to_string()))?;
            text.trim().to_string()
        }
    };
    if reason.is_empty() && settings.require_reason.iter().any(|r| r == resource) {
        return Err(ApiError::bad_request(format!(
            "header {REASON_HEADER} is required for changes to {resource:?} (audit.require_reason); \
             say why, e.g. kayra-cli --reason TEXT"
        )));
    }
    Ok(reason)
}

/// The audit context of a change request, from its route and path
/// parameters; 400 when its reason is refused.
pub(crate) fn context(
    parts: &Parts,
    params: &[(String, String)],
    caller: &Caller,
    resource: &'static str,
    verb: Verb,
    settings: &AuditSettings,
) -> Result<AuditContext, ApiError> {
    let reason = reason(&parts.headers, resource, settings)?;
    let param = |name: &str| params.iter().find(|(k, _)| k == name).map(|(_, v)| v.clone()).unwrap_or_default();
    let (namespace, name) = match resource {
        "namespaces" => (String::new(), param("namespace")),
        "subscriptions" | "subscriptions/sync" | "subscriptions/cancel" => (param("namespace"), param("api")),
        _ => (param("namespace"), param("name")),
    };
    Ok(AuditContext {
        user: caller.user.clone(),
        verb: verb.as_str().to_string(),
        resource: resource.to_string(),
        namespace,
        name,
        code: success_code(&parts.method),
        reason,
        request_id: uuid::Uuid::now_v7().to_string(),
        source: parts.extensions.get::<ClientSource>().map(|s| s.0.to_string()).unwrap_or_default(),
    })
}

/// The state of a change route: its Repository records the change.
pub(crate) struct Audited(pub ApiState);

impl FromRequestParts<ApiState> for Audited {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &ApiState) -> Result<Self, ApiError> {
        let Some(context) = parts.extensions.get::<AuditContext>() else {
            tracing::error!("a change route ran without its audit context; refused");
            return Err(ApiError::internal());
        };
        Ok(Self(state.clone().with_repo(state.repo.audited(context.clone()))))
    }
}

/// `GET /audit`'s query.
#[derive(Debug, Default, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct AuditQuery {
    /// Only this user's changes.
    #[serde(default)]
    pub user: String,
    /// Only changes to this RBAC resource (`apiregistrations/sync`, …).
    #[serde(default)]
    pub resource: String,
    #[serde(default)]
    pub namespace: String,
    #[serde(default)]
    pub name: String,
    /// RFC 3339: only changes made at or after it.
    #[serde(default)]
    pub since: String,
    /// At most this many items; absent or 0: as many as one page reads.
    pub limit: Option<usize>,
    /// The `continue` of the previous page.
    #[serde(rename = "continue")]
    #[param(rename = "continue")]
    pub continue_token: Option<String>,
    /// `true`: a stream of the records made from now on (see docs/audit.md).
    #[serde(default)]
    pub watch: Option<String>,
}

impl AuditQuery {
    pub(crate) fn filter(&self) -> Result<AuditFilter, ApiError> {
        let since = match self.since.as_str() {
            "" => None,
            since => Some(humantime::parse_rfc3339_weak(since).map_err(|_| {
                ApiError::bad_request(format!(
                    "query parameter \"since\" must be an RFC 3339 time, e.g. 2026-12-03T10:00:00Z; got {}",
                    super::shown(since)
                ))
            })?),
        };
        Ok(AuditFilter {
            user: self.user.clone(),
            resource: self.resource.clone(),
            namespace: self.namespace.clone(),
            name: self.name.clone(),
            since,
        })
    }
}

#[utoipa::path(get, path = "/audit", tag = "audit", params(AuditQuery),
    responses((status = 200, body = List<AuditRecord>, description = "newest first; a page may hold fewer than `limit` items (even none) and still have a `continue`"),
        (status = 400, body = ErrorBody)))]
pub(crate) async fn list(
    State(state): State<ApiState>,
    Query(query): Query<AuditQuery>,
) -> Result<Json<List<AuditRecord>>, ApiError> {
    let filter = query.filter()?;
    let list = super::list::ListQuery { limit: query.limit, continue_token: query.continue_token.clone() };
    let after = list.after(&state.repo.layout().prefix(Collection::Audit))?;
    let page = state.repo.list_audit(&filter, after.as_deref(), list.limit()).await?;
    Ok(Json(List { items: page.items, continue_token: continue_token(page.next.as_deref()) }))
}

#[utoipa::path(get, path = "/audit/{id}", tag = "audit", params(("id" = String, Path, description = "the record's id")),
    responses((status = 200, body = AuditRecord), (status = 404, body = ErrorBody)))]
pub(crate) async fn get(State(state): State<ApiState>, Path(id): Path<String>) -> Result<Json<AuditRecord>, ApiError> {
    let record = state.repo.get_audit(&id).await?;
    record.map(Json).ok_or_else(|| ApiError::not_found(format!("audit record {} not found", super::shown(&id))))
}

/// `GET /audit?watch=true`: the records made from now on that pass
/// `filter`, each an `ADDED` event, from the store's change feed of the
/// trail. No replay of existing records: the trail is unbounded, and a
/// serve holds none of it in memory. The stream ends when the feed does
/// (the client re-opens, and lists what it missed with `since`).
pub(crate) async fn open(
    hub: &Hub,
    repo: &Repository,
    filter: AuditFilter,
    watcher: Watcher,
    framing: Framing,
    permit: StreamPermit,
) -> Result<axum::response::Response, ApiError> {
    let store = repo.store();
    let revision = store.revision().await.map_err(crate::repo::Error::from)?;
    let prefix = repo.layout().prefix(Collection::Audit);
    let changes = store.changes(&prefix, revision + 1).await.map_err(crate::repo::Error::from)?;
    let outbox = Outbox::new(framing, repo.clone(), watcher, hub.options(), hub.stopping());
    let state = AuditStream { changes, outbox, filter, closed: false, _permit: permit };
    let body = Body::from_stream(futures::stream::unfold(state, |mut s| async move {
        let chunk = s.next_chunk().await?;
        Some((Ok::<Bytes, std::convert::Infallible>(chunk), s))
    }));
    Ok(streaming(framing, body))
}

struct AuditStream {
    changes: kayra_store::ChangeStream,
    outbox: Outbox,
    filter: AuditFilter,
    closed: bool,
    _permit: StreamPermit,
}

impl AuditStream {
    async fn next_chunk(&mut self) -> Option<Bytes> {
        use futures::StreamExt;
        loop {
            if let Some(chunk) = self.outbox.pop() {
                return Some(chunk);
            }
            if self.closed {
                return None;
            }
            tokio::select! {
                alive = self.outbox.housekeeping() => if !alive { self.closed = true },
                change = self.changes.next() => match change {
                    Some(Ok(kayra_store::Change::Event(kayra_store::Event::Put(kv)))) => {
                        match serde_json::from_slice::<AuditRecord>(&kv.value) {
                            Ok(record) if self.filter.matches(&record) => {
                                if let Ok(text) = serde_json::to_string(&record) {
                                    self.outbox.push(frame(Kind::Added, &text, self.outbox.framing()));
                                }
                            }
                            Ok(_) => {}
                            Err(e) => tracing::warn!(key = %kv.key, error = %e, "unreadable audit record skipped"),
                        }
                    }
                    // Deletes are the retention's; progress is no event.
                    Some(Ok(_)) => {}
                    Some(Err(_)) | None => self.closed = true,
                },
            }
        }
    }
}

/// The answer of a change route, as its log line of a refusal needs it.
pub(crate) fn log_denied(user: Option<&str>, resource: &str, verb: &str, status: StatusCode) {
    tracing::info!(
        audit = "denied",
        user = user.unwrap_or_default(),
        resource,
        verb,
        code = status.as_u16(),
        "request refused"
    );
}
