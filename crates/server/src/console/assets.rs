//! The console's files, embedded at compile time from `crates/server/console/`.
//!
//! The list is explicit (no directory walk at build time) so that what ships
//! is reviewable; a test checks that it matches the directory exactly.

/// One embedded file.
#[derive(Debug, Clone, Copy)]
pub struct Asset {
    /// Relative to `/ui/`.
    pub path: &'static str,
    pub content_type: &'static str,
    pub body: &'static [u8],
}

macro_rules! assets {
    ($($path:literal => $type:literal,)*) => {
        /// Every file of the console.
        pub const ASSETS: &[Asset] = &[$(
            Asset { path: $path, content_type: $type, body: include_bytes!(concat!("../../console/", $path)) },
        )*];
    };
}

assets! {
    "index.html" => "text/html; charset=utf-8",
    "style.css" => "text/css; charset=utf-8",
    "favicon.svg" => "image/svg+xml",
    "js/app.js" => "text/javascript; charset=utf-8",
    "js/api.js" => "text/javascript; charset=utf-8",
    "js/dom.js" => "text/javascript; charset=utf-8",
    "js/fleet.js" => "text/javascript; charset=utf-8",
    "js/live.js" => "text/javascript; charset=utf-8",
    "js/rollout.js" => "text/javascript; charset=utf-8",
    "js/signin.js" => "text/javascript; charset=utf-8",
    "js/pages/apis.js" => "text/javascript; charset=utf-8",
    "js/pages/api.js" => "text/javascript; charset=utf-8",
    "js/pages/namespaces.js" => "text/javascript; charset=utf-8",
    "js/pages/namespace.js" => "text/javascript; charset=utf-8",
    "js/pages/subscription.js" => "text/javascript; charset=utf-8",
}

/// The asset at `path` (relative to `/ui/`), if there is one. Only exact
/// names match, so no path can reach outside the embedded set.
pub fn find(path: &str) -> Option<&'static Asset> {
    ASSETS.iter().find(|a| a.path == path)
}

#[cfg(test)]
mod tests {
    use std::path::{Path, PathBuf};

    use super::*;

    fn files(dir: &Path, base: &Path, out: &mut Vec<String>) {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path: PathBuf = entry.unwrap().path();
            if path.is_dir() {
                files(&path, base, out);
            } else {
                out.push(path.strip_prefix(base).unwrap().to_string_lossy().into_owned());
            }
        }
    }

    #[test]
    fn the_list_matches_the_directory() {
        let base = Path::new(env!("CARGO_MANIFEST_DIR")).join("console");
        let mut on_disk = Vec::new();
        files(&base, &base, &mut on_disk);
        on_disk.sort();
        let mut listed: Vec<String> = ASSETS.iter().map(|a| a.path.to_string()).collect();
        listed.sort();
        assert_eq!(listed, on_disk, "crates/server/console/ and the ASSETS list differ");
    }

    fn text(asset: &Asset) -> &'static str {
        std::str::from_utf8(asset.body).unwrap()
    }

    /// The CSP would block inline code anyway; keeping the source free of it
    /// means the console works under that policy at all.
    #[test]
    fn the_page_has_no_inline_script_or_style() {
        let html = text(find("index.html").unwrap()).to_ascii_lowercase();
        assert!(!html.contains(" style="), "inline style attribute");
        assert!(!html.contains("<style"), "inline style element");
        assert!(!html.contains("javascript:"), "javascript: URL");
        for (i, _) in html.match_indices("<script") {
            let tag = &html[i..i + html[i..].find('>').unwrap()];
            assert!(tag.contains(" src="), "inline script: {tag}");
        }
        let attributes = html.split(|c: char| c.is_whitespace()).filter(|w| w.starts_with("on") && w.contains('='));
        assert_eq!(attributes.count(), 0, "inline event handler");
    }

    /// Data reaches the page only as text: no script builds markup from strings.
    #[test]
    fn no_script_parses_markup() {
        for asset in ASSETS.iter().filter(|a| a.path.ends_with(".js")) {
            let js = text(asset);
            for sink in
                ["innerHTML", "outerHTML", "insertAdjacentHTML", "document.write", "eval(", "new Function", ".style."]
            {
                assert!(!js.contains(sink), "{} uses {sink}", asset.path);
            }
            for store in ["localStorage", "document.cookie"] {
                assert!(!js.contains(store), "{} touches {store}", asset.path);
            }
        }
    }
}
