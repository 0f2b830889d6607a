//! libnftables JSON (`nft -j list ...`) as typed, borrowed structures: only what
//! [`super::nftables`] reads, nothing else kept.
//!
//! Why not `serde_json::Value`: a node with 10,000 Services prints tens of megabytes of JSON,
//! and a `Value` tree of it took hundreds of MiB (BENCHMARKS.md, section 9b). Here strings
//! borrow from the text (`Cow`: owned only when escaped), the objects of other tables and the
//! fields nobody reads are skipped without being built, and a rule's expressions are scanned
//! once for what the reader needs ([`ExprFacts`]): the verdicts (`jump`/`goto` targets, nested
//! in vmaps too), the `dnat` targets and a `masquerade` statement. Rules and map elements stay
//! raw (`RawValue`, a borrowed slice) until their table is known to be kube-proxy's, so another
//! table's objects, whatever their shape, cost a skip and never an error.

use std::borrow::Cow;

use serde::{
    Deserialize, Deserializer,
    de::{DeserializeSeed, IgnoredAny, MapAccess, SeqAccess, Visitor},
};
use serde_json::value::RawValue;

/// The document: `{"nftables": [object, ...]}`.
#[derive(Debug, Deserialize)]
pub struct Doc<'a> {
    #[serde(borrow)]
    pub nftables: Vec<Object<'a>>,
}

/// One object of the list; only rules and maps are read (tables, chains, sets, metainfo are
/// skipped).
#[derive(Debug, Deserialize)]
pub struct Object<'a> {
    #[serde(borrow, default)]
    pub rule: Option<RuleObj<'a>>,
    #[serde(borrow, default)]
    pub map: Option<MapObj<'a>>,
}

#[derive(Debug, Deserialize)]
pub struct RuleObj<'a> {
    #[serde(borrow)]
    pub table: Cow<'a, str>,
    #[serde(borrow)]
    pub chain: Cow<'a, str>,
    #[serde(borrow, default)]
    pub family: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    pub comment: Option<Cow<'a, str>>,
    /// Parsed with [`exprs`] once the table is known.
    #[serde(borrow, default)]
    pub expr: Option<&'a RawValue>,
}

#[derive(Debug, Deserialize)]
pub struct MapObj<'a> {
    #[serde(borrow)]
    pub table: Cow<'a, str>,
    #[serde(borrow)]
    pub name: Cow<'a, str>,
    /// Parsed with [`elements`] once the map is known.
    #[serde(borrow, default)]
    pub elem: Option<&'a RawValue>,
}

/// A scalar of a key or a statement: a string or a number (anything else is skipped).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Scalar<'a> {
    Str(Cow<'a, str>),
    Num(u64),
    Other,
}

impl<'de: 'a, 'a> Deserialize<'de> for Scalar<'a> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Scalar<'de>;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a string or a number")
            }
            fn visit_borrowed_str<E>(self, v: &'de str) -> Result<Self::Value, E> {
                Ok(Scalar::Str(Cow::Borrowed(v)))
            }
            fn visit_str<E>(self, v: &str) -> Result<Self::Value, E> {
                Ok(Scalar::Str(Cow::Owned(v.to_string())))
            }
            fn visit_u64<E>(self, v: u64) -> Result<Self::Value, E> {
                Ok(Scalar::Num(v))
            }
            fn visit_i64<E>(self, _: i64) -> Result<Self::Value, E> {
                Ok(Scalar::Other)
            }
            fn visit_f64<E>(self, _: f64) -> Result<Self::Value, E> {
                Ok(Scalar::Other)
            }
            fn visit_bool<E>(self, _: bool) -> Result<Self::Value, E> {
                Ok(Scalar::Other)
            }
            fn visit_unit<E>(self) -> Result<Self::Value, E> {
                Ok(Scalar::Other)
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut s: A) -> Result<Self::Value, A::Error> {
                while s.next_element::<IgnoredAny>()?.is_some() {}
                Ok(Scalar::Other)
            }
            fn visit_map<A: MapAccess<'de>>(self, mut m: A) -> Result<Self::Value, A::Error> {
                while m.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
                Ok(Scalar::Other)
            }
        }
        d.deserialize_any(V)
    }
}

impl Scalar<'_> {
    pub fn as_str(&self) -> Option<&str> {
        match self {
            Scalar::Str(s) => Some(s),
            _ => None,
        }
    }
}

/// A verdict: `{"goto": {"target": chain}}`, `{"jump": ...}` or `{"drop": null}`.
#[derive(Debug, Default, Deserialize)]
pub struct Verdict<'a> {
    #[serde(borrow, default)]
    pub goto: Option<Target<'a>>,
    #[serde(borrow, default)]
    pub jump: Option<Target<'a>>,
    /// The key `drop` is there (its value is `null`, which `Option` would read as absent).
    #[serde(default, deserialize_with = "present")]
    pub drop: bool,
}

fn present<'de, D: Deserializer<'de>>(d: D) -> Result<bool, D::Error> {
    IgnoredAny::deserialize(d).map(|_| true)
}

impl Verdict<'_> {
    pub fn target(&self) -> Option<&str> {
        self.goto
            .as_ref()
            .or(self.jump.as_ref())
            .and_then(|t| t.target.as_deref())
    }
}

#[derive(Debug, Default, Deserialize)]
pub struct Target<'a> {
    #[serde(borrow, default)]
    pub target: Option<Cow<'a, str>>,
}

/// A verdict map's key: `{"concat": [...]}`, or with a comment `{"elem": {"val": {"concat":
/// [...]}, "comment": ...}}`.
#[derive(Debug, Default, Deserialize)]
pub struct ElemKey<'a> {
    #[serde(borrow, default)]
    pub concat: Option<Vec<Scalar<'a>>>,
    #[serde(borrow, default)]
    pub elem: Option<Box<ElemVal<'a>>>,
}

#[derive(Debug, Default, Deserialize)]
pub struct ElemVal<'a> {
    #[serde(borrow, default)]
    pub val: ElemKey<'a>,
    #[serde(borrow, default)]
    pub comment: Option<Cow<'a, str>>,
}

impl ElemKey<'_> {
    /// The element's comment (kube-proxy writes the Service's `namespace/name:port`).
    pub fn comment(&self) -> Option<&str> {
        self.elem.as_ref().and_then(|e| e.comment.as_deref())
    }

    /// The concatenated key's parts.
    pub fn parts(&self) -> Option<&[Scalar<'_>]> {
        match (&self.concat, &self.elem) {
            (Some(c), _) => Some(c),
            (None, Some(e)) => e.val.parts(),
            (None, None) => None,
        }
    }
}

/// A verdict map's elements: `[[key, verdict], ...]`; an element of another shape is left
/// out (`None`), as the reader skips what kube-proxy does not write.
pub fn elements<'a>(raw: &'a RawValue) -> serde_json::Result<Vec<(ElemKey<'a>, Verdict<'a>)>> {
    let all: Vec<Element<'a>> = serde_json::from_str(raw.get())?;
    Ok(all.into_iter().filter_map(|e| e.0).collect())
}

/// One element, if it is a `[key, verdict]` pair of objects.
struct Element<'a>(Option<(ElemKey<'a>, Verdict<'a>)>);

impl<'de: 'a, 'a> Deserialize<'de> for Element<'a> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Element<'de>;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a map element")
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut s: A) -> Result<Self::Value, A::Error> {
                let key = s.next_element::<&'de RawValue>()?;
                let verdict = s.next_element::<&'de RawValue>()?;
                while s.next_element::<IgnoredAny>()?.is_some() {}
                let parse = || {
                    Some((
                        serde_json::from_str(key?.get()).ok()?,
                        serde_json::from_str(verdict?.get()).ok()?,
                    ))
                };
                Ok(Element(parse()))
            }
            fn visit_map<A: MapAccess<'de>>(self, mut m: A) -> Result<Self::Value, A::Error> {
                while m.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
                Ok(Element(None))
            }
            fn visit_borrowed_str<E>(self, _: &'de str) -> Result<Self::Value, E> {
                Ok(Element(None))
            }
            fn visit_str<E>(self, _: &str) -> Result<Self::Value, E> {
                Ok(Element(None))
            }
            fn visit_u64<E>(self, _: u64) -> Result<Self::Value, E> {
                Ok(Element(None))
            }
            fn visit_i64<E>(self, _: i64) -> Result<Self::Value, E> {
                Ok(Element(None))
            }
            fn visit_f64<E>(self, _: f64) -> Result<Self::Value, E> {
                Ok(Element(None))
            }
            fn visit_bool<E>(self, _: bool) -> Result<Self::Value, E> {
                Ok(Element(None))
            }
            fn visit_unit<E>(self) -> Result<Self::Value, E> {
                Ok(Element(None))
            }
        }
        d.deserialize_any(V)
    }
}

/// A rule's expressions, each scanned for what the reader needs.
pub fn exprs<'a>(raw: &'a RawValue) -> serde_json::Result<Vec<ExprFacts<'a>>> {
    serde_json::from_str(raw.get())
}

/// What one expression of a rule says, gathered while it is parsed (no tree is built).
#[derive(Debug, Default, PartialEq, Eq)]
pub struct ExprFacts<'a> {
    /// The expression is itself a `jump`/`goto` verdict: its chain.
    pub verdict: Option<Cow<'a, str>>,
    /// Every `jump`/`goto` target inside it (vmaps, numgen maps), its own included.
    pub targets: Vec<Cow<'a, str>>,
    /// Every `dnat` inside it: (address, port).
    pub dnats: Vec<(Cow<'a, str>, Option<u16>)>,
    /// The expression is a `masquerade` statement: its flags.
    pub masquerade: Option<Vec<Cow<'a, str>>>,
}

impl<'de: 'a, 'a> Deserialize<'de> for ExprFacts<'a> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let mut facts = ExprFacts::<'de>::default();
        d.deserialize_any(Scan {
            facts: &mut facts,
            top: true,
        })?;
        Ok(facts)
    }
}

/// Walks one expression, recording verdicts, `dnat`s and a top-level `masquerade`.
struct Scan<'f, 'a> {
    facts: &'f mut ExprFacts<'a>,
    /// At the expression's own level (not nested in it).
    top: bool,
}

impl<'de> DeserializeSeed<'de> for Scan<'_, 'de> {
    type Value = ();
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_any(self)
    }
}

#[derive(Deserialize)]
struct Dnat<'a> {
    #[serde(borrow, default)]
    addr: Option<Scalar<'a>>,
    #[serde(borrow, default)]
    port: Option<Scalar<'a>>,
}

#[derive(Deserialize)]
struct Masquerade<'a> {
    #[serde(borrow, default)]
    flags: Option<Flags<'a>>,
}

/// `"flags": "fully-random"` or `["random", "persistent"]`.
#[derive(Deserialize)]
#[serde(untagged)]
enum Flags<'a> {
    #[serde(borrow)]
    One(Cow<'a, str>),
    #[serde(borrow)]
    Many(Vec<Cow<'a, str>>),
}

impl<'de> Visitor<'de> for Scan<'_, 'de> {
    type Value = ();

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("an nftables expression")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut m: A) -> Result<(), A::Error> {
        while let Some(key) = m.next_key::<Cow<'de, str>>()? {
            match key.as_ref() {
                "jump" | "goto" => {
                    let t: Target<'de> = m.next_value()?;
                    if let Some(target) = t.target {
                        if self.top {
                            self.facts.verdict = Some(target.clone());
                        }
                        self.facts.targets.push(target);
                    }
                }
                "dnat" => {
                    let d: Option<Dnat<'de>> = m.next_value()?;
                    if let Some(Dnat {
                        addr: Some(Scalar::Str(addr)),
                        port,
                    }) = d
                    {
                        let port = match port {
                            Some(Scalar::Num(n)) => u16::try_from(n).ok(),
                            Some(Scalar::Str(s)) => s.parse().ok(),
                            _ => None,
                        };
                        self.facts.dnats.push((addr, port));
                    }
                }
                "masquerade" if self.top => {
                    let masq: Option<Masquerade<'de>> = m.next_value()?;
                    self.facts.masquerade = Some(match masq.and_then(|m| m.flags) {
                        Some(Flags::One(f)) => vec![f],
                        Some(Flags::Many(fs)) => fs,
                        None => Vec::new(),
                    });
                }
                _ => m.next_value_seed(Scan {
                    facts: self.facts,
                    top: false,
                })?,
            }
        }
        Ok(())
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut s: A) -> Result<(), A::Error> {
        while s
            .next_element_seed(Scan {
                facts: self.facts,
                top: false,
            })?
            .is_some()
        {}
        Ok(())
    }

    fn visit_borrowed_str<E>(self, _: &'de str) -> Result<(), E> {
        Ok(())
    }
    fn visit_str<E>(self, _: &str) -> Result<(), E> {
        Ok(())
    }
    fn visit_u64<E>(self, _: u64) -> Result<(), E> {
        Ok(())
    }
    fn visit_i64<E>(self, _: i64) -> Result<(), E> {
        Ok(())
    }
    fn visit_f64<E>(self, _: f64) -> Result<(), E> {
        Ok(())
    }
    fn visit_bool<E>(self, _: bool) -> Result<(), E> {
        Ok(())
    }
    fn visit_unit<E>(self) -> Result<(), E> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_expression_yields_its_verdicts_dnats_and_masquerade_and_nothing_else() {
        let e: Vec<ExprFacts<'_>> = serde_json::from_str(
            r#"[
              {"match": {"op": "==", "left": {"meta": {"key": "l4proto"}}, "right": "tcp"}},
              {"jump": {"target": "mark-for-masquerade"}},
              {"vmap": {"key": {"numgen": {"mode": "random", "mod": 2}},
                        "data": {"set": [[0, {"goto": {"target": "endpoint-A"}}],
                                         [1, {"goto": {"target": "endpoint-B"}}]]}}},
              {"dnat": {"addr": "10.244.1.5", "port": 8443, "family": "ip"}},
              {"masquerade": {"flags": ["random", "persistent"]}},
              {"masquerade": null},
              {"comment": "a \"quoted\" comment"}
            ]"#,
        )
        .unwrap();
        assert_eq!(e.len(), 7);
        assert_eq!(e[0], ExprFacts::default());
        assert_eq!(e[1].verdict.as_deref(), Some("mark-for-masquerade"));
        assert_eq!(
            e[2].verdict, None,
            "nested in a vmap: not the rule's verdict"
        );
        assert_eq!(e[2].targets, ["endpoint-A", "endpoint-B"]);
        assert_eq!(e[3].dnats, [(Cow::Borrowed("10.244.1.5"), Some(8443))]);
        assert_eq!(
            e[4].masquerade.as_deref(),
            Some(&[Cow::Borrowed("random"), Cow::Borrowed("persistent")][..])
        );
        assert_eq!(e[5].masquerade.as_deref(), Some(&[][..]));
    }

    #[test]
    fn objects_of_other_tables_are_skipped_whatever_their_shape() {
        let doc: Doc<'_> = serde_json::from_str(
            r#"{"nftables": [
              {"metainfo": {"version": "1.0.6"}},
              {"map": {"family": "inet", "table": "filter", "name": "m", "elem": [["1.2.3.4", "accept"]]}},
              {"rule": {"family": "inet", "table": "filter", "chain": "c", "expr": [{"weird": [1, {"x": null}]}]}},
              {"set": {"name": "s"}}
            ]}"#,
        )
        .unwrap();
        assert_eq!(doc.nftables.len(), 4);
        let map = doc.nftables[1].map.as_ref().unwrap();
        assert_eq!(map.table, "filter");
        // The other table's element shape is no kube-proxy key: left out (and never parsed:
        // the reader checks the table first).
        assert!(elements(map.elem.unwrap()).unwrap().is_empty());
        let rule = doc.nftables[2].rule.as_ref().unwrap();
        assert_eq!(exprs(rule.expr.unwrap()).unwrap(), [ExprFacts::default()]);
    }
}
