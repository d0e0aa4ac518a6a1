//! Lists: `{"items": [...], "continue": ""}`, sorted by name, paginated
//! with `?limit=N&continue=TOKEN` (§4).
//!
//! The continue token is opaque to clients: the base64url of the last key
//! of the page. Store keys sort byte-wise and names are ASCII, so "after
//! this key" is "after this name", and a page stays correct when records
//! are added or removed between requests (no offsets to drift). A token is
//! only accepted for the collection it came from.

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};

use super::ApiState;
use super::error::ApiError;
use crate::repo::Collection;

/// `?limit=N&continue=TOKEN`.
#[derive(Debug, Default, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct ListQuery {
    /// At most this many items; absent or 0 means all.
    pub limit: Option<usize>,
    /// The `continue` of the previous page.
    #[serde(rename = "continue")]
    #[param(rename = "continue")]
    pub continue_token: Option<String>,
}

/// One page of a collection.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct List<T> {
    /// Sorted by name.
    pub items: Vec<T>,
    /// Pass as `?continue=` for the next page; empty when none remain.
    #[serde(rename = "continue")]
    pub continue_token: String,
}

impl ListQuery {
    pub fn limit(&self) -> usize {
        self.limit.unwrap_or(0)
    }

    /// The key to continue after, checked to lie in `scope` (the
    /// collection's key prefix, or "" for collections paged in memory).
    pub fn after(&self, scope: &str) -> Result<Option<String>, ApiError> {
        let Some(token) = self.continue_token.as_deref().filter(|t| !t.is_empty()) else {
            return Ok(None);
        };
        let invalid = || ApiError::bad_request("invalid continue token; pass the \"continue\" of the previous page");
        let bytes = URL_SAFE_NO_PAD.decode(token).map_err(|_| invalid())?;
        let key = String::from_utf8(bytes).map_err(|_| invalid())?;
        if !key.starts_with(scope) {
            return Err(invalid());
        }
        Ok(Some(key))
    }
}

/// The token that continues after `key`.
pub fn continue_token(key: Option<&str>) -> String {
    key.map(|k| URL_SAFE_NO_PAD.encode(k)).unwrap_or_default()
}

/// One page of `collection`, each record turned into its wire form.
pub async fn page<T, V>(
    state: &ApiState,
    collection: Collection<'_>,
    query: &ListQuery,
    view: impl FnMut(T) -> V,
) -> Result<List<V>, ApiError>
where
    T: serde::de::DeserializeOwned,
{
    let after = query.after(&state.repo.layout().prefix(collection))?;
    let page = state.repo.list::<T>(collection, after.as_deref(), query.limit()).await?;
    Ok(List {
        items: page.items.into_iter().map(|v| v.value).map(view).collect(),
        continue_token: continue_token(page.next.as_deref()),
    })
}

/// Pages a collection held in memory, sorted by `key`.
pub fn page_in_memory<T>(items: Vec<T>, query: &ListQuery, key: impl Fn(&T) -> &str) -> Result<List<T>, ApiError> {
    let after = query.after("")?;
    let mut rest: Vec<T> = items.into_iter().filter(|item| after.as_deref().is_none_or(|a| key(item) > a)).collect();
    let limit = query.limit();
    let mut next = None;
    if limit > 0 && rest.len() > limit {
        rest.truncate(limit);
        next = rest.last().map(|last| key(last).to_string());
    }
    Ok(List { items: rest, continue_token: continue_token(next.as_deref()) })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn query(limit: Option<usize>, token: Option<String>) -> ListQuery {
        ListQuery { limit, continue_token: token }
    }

    #[test]
    fn tokens_round_trip_and_are_scoped() {
        let layout = crate::repo::Layout::new("dev", "local");
        let core = layout.key(crate::repo::RecordRef::Namespace("core"));
        let token = continue_token(Some(&core));
        assert_eq!(query(None, Some(token.clone())).after(&layout.prefix(Collection::Namespaces)).unwrap(), Some(core));
        assert!(query(None, Some(token)).after(&layout.prefix(Collection::Users)).is_err());
        assert!(query(None, Some("!!".into())).after("").is_err());
        assert_eq!(query(None, Some(String::new())).after("/x/").unwrap(), None);
        assert_eq!(continue_token(None), "");
    }

    #[test]
    fn in_memory_pages_cover_everything_once() {
        let items: Vec<String> = ["a", "b", "c", "d", "e"].iter().map(|s| s.to_string()).collect();
        let mut seen = Vec::new();
        let mut token = None;
        loop {
            let page = page_in_memory(items.clone(), &query(Some(2), token), |s| s.as_str()).unwrap();
            seen.extend(page.items);
            if page.continue_token.is_empty() {
                break;
            }
            token = Some(page.continue_token);
        }
        assert_eq!(seen, items);
        let all = page_in_memory(items.clone(), &query(None, None), |s| s.as_str()).unwrap();
        assert_eq!((all.items.len(), all.continue_token.as_str()), (5, ""));
    }
}
