//! `[lists]` and a rule's `allow` / `deny`: client networks and API keys
//! never limited or always refused.
//!
//! A keys file holds one API key, or its hash as `slidegate identity hash`
//! prints it (16 hex digits), per line; blank lines and lines starting with
//! `#` are skipped. Each key is hashed as it is read and only the hash is
//! kept. Errors in the file are located in it, by its own line numbers.

use std::io::Read;
use std::ops::Range;
use std::path::{Path, PathBuf};

use slidegate_http::config::IdentityConfig;
use slidegate_http::{canonical_net, AccessLists, ClientList, KeyHasher, KeyList};
use toml::Spanned;

use super::super::error::ConfigError;
use super::super::raw::RawClientList;
use super::super::values::Cidr;
use super::{decode, Validator};

/// The largest keys file read: 64 MiB, over a million keys.
const MAX_KEYS_FILE: u64 = 64 << 20;

/// The longest key a line may hold, in bytes: longer is no API key a
/// client sends (servers refuse header lines of a few KiB).
const MAX_KEY: usize = 4096;

/// How keys are hashed for the lists of one configuration.
pub(super) struct ListKeys {
    hasher: KeyHasher,
    /// Whether the hasher is the identity secret's: only then does a listed
    /// hash (16 hex digits) mean what `slidegate identity hash` printed.
    keyed: bool,
    /// Whether requests carry an API key at all (`[identity] api_key_header`).
    read: bool,
}

impl Validator<'_> {
    /// How the keys of this configuration's lists are hashed.
    pub(super) fn list_keys(&self, identity: &IdentityConfig) -> ListKeys {
        let (hasher, keyed) = match &identity.secret {
            Some(secret) => (KeyHasher::keyed(secret), true),
            None => (KeyHasher::per_process(), false),
        };
        ListKeys { hasher, keyed, read: identity.api_key_header.is_some() }
    }

    /// An allow list and a deny list (`[lists]` or a rule's).
    pub(super) fn lists(
        &self,
        allow: Option<RawClientList>,
        deny: Option<RawClientList>,
        keys: &ListKeys,
    ) -> Result<AccessLists, ConfigError> {
        let mut lists = AccessLists::default();
        lists.allow = self.client_list("allow", allow.unwrap_or_default(), keys, None)?;
        lists.deny = self.client_list("deny", deny.unwrap_or_default(), keys, Some(&lists.allow))?;
        Ok(lists)
    }

    /// One list; `allow` is the allow list beside a deny list, whose
    /// entries may not be in both.
    fn client_list(
        &self,
        which: &str,
        raw: RawClientList,
        keys: &ListKeys,
        allow: Option<&ClientList>,
    ) -> Result<ClientList, ConfigError> {
        let mut list = ClientList::default();
        for cidr in raw.cidrs {
            let net = match cidr.get_ref().parse::<Cidr>() {
                Ok(Cidr(net)) => canonical_net(net),
                Err(_) => {
                    return Err(self.err(
                        cidr.span(),
                        format!(
                            "invalid CIDR {:?} in {which}.cidrs: expected a block such as \"10.0.0.0/8\" or \
                             \"2001:db8::/32\", or one address",
                            cidr.get_ref()
                        ),
                    ))
                }
            };
            if allow.is_some_and(|a| a.cidrs.contains(&net)) {
                return Err(self.err(
                    cidr.span(),
                    format!("{net} is in both allow.cidrs and deny.cidrs: deny would win; list it once"),
                ));
            }
            if !list.cidrs.contains(&net) {
                list.cidrs.push(net);
            }
        }
        list.keys = KeyList::new(keys.hasher.clone());
        if let Some(file) = raw.keys_file {
            if !keys.read {
                return Err(self.err(
                    file.span(),
                    format!(
                        "{which}.keys_file lists API keys, but [identity] sets no api_key_header: requests \
                         carry no key to match; set api_key_header or list cidrs only"
                    ),
                ));
            }
            self.read_keys(&file, keys, &mut list.keys, allow.map(|a| &a.keys))?;
        }
        Ok(list)
    }

    /// Reads the keys file `file` names into `list`.
    fn read_keys(
        &self,
        file: &Spanned<String>,
        keys: &ListKeys,
        list: &mut KeyList,
        allow: Option<&KeyList>,
    ) -> Result<(), ConfigError> {
        let path = self.beside(file.get_ref());
        let bytes = read_bounded(&path).map_err(|err| {
            self.err(file.span(), format!("cannot read keys_file {}: {err}", path.display()))
        })?;
        let text = decode(&path, &bytes)?;
        let at = |span: Range<usize>, message: String| ConfigError::at(&path, text, Some(span), message);
        let mut start = 0;
        for line in text.split_inclusive('\n') {
            let span_start = start;
            start += line.len();
            let trimmed = line.trim_matches([' ', '\t', '\r', '\n']);
            if trimmed.is_empty() || trimmed.starts_with('#') {
                continue;
            }
            let offset = span_start + (line.len() - line.trim_start_matches([' ', '\t']).len());
            let span = offset..offset + trimmed.len();
            let hashes = line_hashes(trimmed, keys).map_err(|message| at(span.clone(), message))?;
            if let Some(hash) = hashes.iter().find(|h| allow.is_some_and(|a| a.contains_hash(**h))) {
                return Err(at(
                    span,
                    format!("key {hash:016x} (by its hash) is also on the allow list: deny would win; list it once"),
                ));
            }
            for hash in hashes {
                list.insert_hash(hash);
            }
        }
        Ok(())
    }

    /// `file` as written, or next to the configuration file when relative.
    pub(super) fn beside(&self, file: &str) -> PathBuf {
        let file = Path::new(file);
        match self.path.parent() {
            Some(dir) if file.is_relative() => dir.join(file),
            _ => file.to_owned(),
        }
    }
}

/// The hashes one line of a keys file lists: its key's, and for 16 hex
/// digits the hash they are (a key may itself be 16 hex digits: both are
/// listed).
fn line_hashes(line: &str, keys: &ListKeys) -> Result<Vec<u64>, String> {
    if line.len() == 16 && line.bytes().all(|b| b.is_ascii_hexdigit()) {
        if !keys.keyed {
            return Err("16 hex digits are read as a key's hash (`slidegate identity hash`), which needs \
                        [identity] ip_hash_secret_env: without it each process hashes with a random secret \
                        and no listed hash can match; set it, or list the key itself"
                .to_owned());
        }
        let hash = u64::from_str_radix(line, 16).map_err(|e| format!("invalid hash: {e}"))?;
        return Ok(vec![hash, keys.hasher.hash(line.as_bytes())]);
    }
    if line.len() > MAX_KEY {
        return Err(format!(
            "a key of {} bytes: expected at most {MAX_KEY} (one API key per line)",
            line.len()
        ));
    }
    if line.contains(',') {
        return Err("a key with a comma: serve refuses such a request with 400 and never matches it; one \
                    key per line"
            .to_owned());
    }
    if line.bytes().any(|b| b.is_ascii_control() && b != b'\t') {
        return Err("a control character: an API key is an HTTP header value, which has none".to_owned());
    }
    Ok(vec![keys.hasher.hash(line.as_bytes())])
}

/// The bytes of `path`, refused past [`MAX_KEYS_FILE`].
fn read_bounded(path: &Path) -> std::io::Result<Vec<u8>> {
    // A FIFO would block the open itself, a device never end: asked first.
    if !std::fs::metadata(path)?.is_file() {
        return Err(std::io::Error::other("not a regular file"));
    }
    let mut bytes = Vec::new();
    std::fs::File::open(path)?.take(MAX_KEYS_FILE + 1).read_to_end(&mut bytes)?;
    if bytes.len() as u64 > MAX_KEYS_FILE {
        return Err(std::io::Error::other(format!("larger than {} MiB", MAX_KEYS_FILE >> 20)));
    }
    Ok(bytes)
}
