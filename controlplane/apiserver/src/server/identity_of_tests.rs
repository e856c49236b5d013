//! A client certificate's subject read as an identity: CN the subject, exactly one O the role.

use rcgen::string::BmpString;
use rcgen::{CertificateParams, DnType, DnValue, KeyPair};

use super::identity_of;
use crate::auth::AuthError;

fn certificate(common_name: &str, organizations: Vec<(DnType, DnValue)>) -> Vec<u8> {
    let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
    params
        .distinguished_name
        .push(DnType::CommonName, common_name);
    for (kind, value) in organizations {
        params.distinguished_name.push(kind, value);
    }
    let key = KeyPair::generate().unwrap();
    params.self_signed(&key).unwrap().der().to_vec()
}

/// The organizationName attribute again, under its OID, so a subject can carry two O values
/// (rcgen keeps one value per attribute type).
fn second_organization() -> DnType {
    DnType::CustomDnType(vec![2, 5, 4, 10])
}

#[test]
fn one_readable_organization_is_the_role() {
    let der = certificate(
        "vm-1",
        vec![(
            DnType::OrganizationName,
            DnValue::Utf8String("vm-agent".into()),
        )],
    );
    let identity = identity_of(&der).unwrap();
    assert_eq!(identity.user_name(), "sluice:vm-agent:vm-1");
}

#[test]
fn an_unreadable_second_organization_refuses_the_certificate() {
    let der = certificate(
        "vm-1",
        vec![
            (
                DnType::OrganizationName,
                DnValue::Utf8String("vm-agent".into()),
            ),
            (
                second_organization(),
                DnValue::BmpString(BmpString::try_from("admin").unwrap()),
            ),
        ],
    );
    assert_eq!(
        identity_of(&der).err(),
        Some(AuthError::CertificateWithoutRole)
    );
}

#[test]
fn two_readable_organizations_refuse_the_certificate() {
    let der = certificate(
        "vm-1",
        vec![
            (
                DnType::OrganizationName,
                DnValue::Utf8String("vm-agent".into()),
            ),
            (second_organization(), DnValue::Utf8String("admin".into())),
        ],
    );
    assert_eq!(
        identity_of(&der).err(),
        Some(AuthError::CertificateWithoutRole)
    );
}
