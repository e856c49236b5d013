//! One macro for every word of the vocabulary, so that `as_str`, `parse`, `NAMES`, `Display`,
//! `FromStr` and serde cannot disagree.

macro_rules! vocabulary {
    (
        $(#[$meta:meta])*
        $name:ident, $field:literal, $count:literal {
            $( $(#[$variant_meta:meta])* $variant:ident => $text:literal, )+
        }
    ) => {
        $(#[$meta])*
        #[derive(
            Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash,
            serde::Serialize, serde::Deserialize,
        )]
        pub enum $name {
            $( $(#[$variant_meta])* #[serde(rename = $text)] $variant, )+
        }

        impl $name {
            /// Every value, in declaration order.
            pub const ALL: [$name; $count] = [$( $name::$variant, )+];
            /// Every wire name, in declaration order.
            pub const NAMES: [&'static str; $count] = [$( $text, )+];
            /// The field this word is read from, for errors.
            pub const FIELD: &'static str = $field;

            /// The wire name.
            pub const fn as_str(self) -> &'static str {
                match self {
                    $( $name::$variant => $text, )+
                }
            }

            /// The names as a phrase, "A, B or C", for descriptions and messages.
            pub fn one_of() -> String {
                match Self::NAMES.split_last() {
                    Some((last, [])) => last.to_string(),
                    Some((last, rest)) => format!("{} or {last}", rest.join(", ")),
                    None => String::new(),
                }
            }

            /// The value a wire name stands for (names are case-sensitive).
            pub fn parse(text: &str) -> Option<Self> {
                Self::ALL.into_iter().find(|value| value.as_str() == text)
            }
        }

        impl std::fmt::Display for $name {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(self.as_str())
            }
        }

        impl std::str::FromStr for $name {
            type Err = $crate::UnknownName;

            fn from_str(text: &str) -> Result<Self, Self::Err> {
                Self::parse(text).ok_or_else(|| $crate::UnknownName {
                    field: $field,
                    found: text.chars().take(64).collect(),
                    allowed: &Self::NAMES,
                })
            }
        }
    };
}
