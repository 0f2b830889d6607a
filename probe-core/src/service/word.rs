//! [`ApiWord`]: a word of one of the API's closed vocabularies (a Service's type, a port's
//! protocol, a traffic policy, an ingress' ipMode), held without an allocation of its own when
//! it is one of the spellings the API defines. The agent's store holds several per Service for
//! the Service's life; as `String`s each was a heap block (decisions.md "One store"). It reads
//! as a `&str`; a spelling the API does not define (a faulty API server) is held as written.

use std::{borrow::Cow, fmt, ops::Deref};

/// The spellings of the fields held as words: `ServiceType`, `Protocol`,
/// `ServiceExternalTrafficPolicy` / `ServiceInternalTrafficPolicy`, `LoadBalancerIPMode`
/// (kubernetes/kubernetes `pkg/apis/core/types.go`).
const SPELLINGS: [&str; 11] = [
    "ClusterIP",
    "NodePort",
    "LoadBalancer",
    "ExternalName",
    "TCP",
    "UDP",
    "SCTP",
    "Cluster",
    "Local",
    "VIP",
    "Proxy",
];

/// A word of the API's vocabularies; compares, prints and reads as its text.
#[derive(Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ApiWord(Cow<'static, str>);

impl ApiWord {
    pub fn as_str(&self) -> &str {
        &self.0
    }

    fn known(word: &str) -> Option<ApiWord> {
        SPELLINGS
            .iter()
            .find(|s| **s == word)
            .map(|s| ApiWord(Cow::Borrowed(s)))
    }
}

impl From<&str> for ApiWord {
    fn from(word: &str) -> ApiWord {
        ApiWord::known(word).unwrap_or_else(|| ApiWord(Cow::Owned(word.to_owned())))
    }
}

impl From<String> for ApiWord {
    fn from(word: String) -> ApiWord {
        ApiWord::known(&word).unwrap_or(ApiWord(Cow::Owned(word)))
    }
}

impl Deref for ApiWord {
    type Target = str;
    fn deref(&self) -> &str {
        &self.0
    }
}

impl AsRef<str> for ApiWord {
    fn as_ref(&self) -> &str {
        &self.0
    }
}

impl PartialEq<str> for ApiWord {
    fn eq(&self, other: &str) -> bool {
        *self.0 == *other
    }
}

impl PartialEq<&str> for ApiWord {
    fn eq(&self, other: &&str) -> bool {
        *self.0 == **other
    }
}

impl fmt::Display for ApiWord {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// As the `String` it replaced printed (`{:?}` of the facts is in test output and logs).
impl fmt::Debug for ApiWord {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&*self.0, f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_known_spelling_is_not_allocated_and_any_other_is_kept_as_written() {
        for s in SPELLINGS {
            let word = ApiWord::from(s.to_string());
            assert!(matches!(word.0, Cow::Borrowed(_)), "{s}");
            assert_eq!(word, s);
        }
        let odd = ApiWord::from("tcp");
        assert!(matches!(odd.0, Cow::Owned(_)));
        assert_eq!(odd.as_str(), "tcp");
        assert_eq!(format!("{odd:?} {odd}"), "\"tcp\" tcp");
    }
}
