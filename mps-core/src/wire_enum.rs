//! One definition per wire enum.
//!
//! [`wire_enum!`](crate::wire_enum) declares a fieldless enum whose numeric values travel on the
//! wire or through the C ABI, and from the same list derives everything that used to be spelled
//! out beside it: the list of every variant in declaration order (`ALL`), the conversion from the
//! wire value, each variant's name (and that name as a C string) and its documentation. Adding a
//! variant is one line, and nothing can be forgotten.

/// Declares a wire enum from one list of `Variant = value => "name"` lines.
///
/// ```
/// mps_core::wire_enum! {
///     /// A colour.
///     pub enum Colour: u8, from_u8 {
///         /// Like grass.
///         Green = 1 => "green",
///         /// Like the sky.
///         Blue = 2 => "blue",
///     }
/// }
/// assert_eq!(Colour::from_u8(2), Some(Colour::Blue));
/// assert_eq!(Colour::Green.name(), "green");
/// assert_eq!(Colour::Blue.c_name(), c"blue");
/// assert_eq!(Colour::ALL, [Colour::Green, Colour::Blue]);
/// assert_eq!(Colour::Green.doc(), "Like grass.");
/// ```
///
/// The values must be literals, so that the conversion is a `match` the compiler checks for
/// duplicates, and the names must not contain a NUL byte (checked at compile time).
#[macro_export]
macro_rules! wire_enum {
    (
        $(#[$meta:meta])*
        $vis:vis enum $name:ident : $repr:ident, $from:ident {
            $(
                $(#[doc = $doc:literal])*
                $variant:ident = $value:literal => $label:literal,
            )+
        }
    ) => {
        $(#[$meta])*
        #[repr($repr)]
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
        $vis enum $name {
            $(
                $(#[doc = $doc])*
                $variant = $value,
            )+
        }

        impl $name {
            /// Every variant, in declaration order.
            $vis const ALL: [$name; [$($value),+].len()] = [$($name::$variant),+];

            /// The variant with this wire value, or `None` for a value no version defines.
            $vis const fn $from(v: $repr) -> Option<$name> {
                match v {
                    $($value => Some($name::$variant),)+
                    _ => None,
                }
            }

            /// The variant's name.
            $vis const fn name(self) -> &'static str {
                match self {
                    $($name::$variant => $label,)+
                }
            }

            /// The variant's name as a NUL-terminated C string.
            $vis const fn c_name(self) -> &'static ::std::ffi::CStr {
                match self {
                    $($name::$variant => const {
                        match ::std::ffi::CStr::from_bytes_with_nul(
                            concat!($label, "\0").as_bytes(),
                        ) {
                            Ok(c) => c,
                            Err(_) => panic!("a wire enum's name holds a NUL byte"),
                        }
                    },)+
                }
            }

            /// The variant's documentation, its lines joined by newlines and trimmed.
            $vis fn doc(self) -> &'static str {
                match self {
                    $($name::$variant => concat!($($doc, "\n"),*).trim_ascii(),)+
                }
            }
        }
    };
}

#[cfg(test)]
mod tests {
    crate::wire_enum! {
        /// For the tests.
        enum Sample: u16, from_u16 {
            /// First,
            /// on two lines.
            A = 3 => "A",
            B = 7 => "bee",
        }
    }

    #[test]
    fn every_derived_item_follows_the_list() {
        assert_eq!(Sample::ALL, [Sample::A, Sample::B]);
        assert_eq!(Sample::from_u16(3), Some(Sample::A));
        assert_eq!(Sample::from_u16(7), Some(Sample::B));
        assert_eq!(Sample::from_u16(4), None);
        assert_eq!(Sample::B as u16, 7);
        assert_eq!(Sample::B.name(), "bee");
        assert_eq!(Sample::B.c_name().to_str(), Ok("bee"));
        assert_eq!(Sample::A.doc(), "First,\n on two lines.");
        assert_eq!(Sample::B.doc(), "");
    }
}
