//! Bank-transfer instructions: the account, the exact amount, the description to type (the
//! payment code), a VietQR image URL and the NAPAS EMVCo payload it encodes.

use serde::Serialize;

use gateway_core::config::PaymentConfig;

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Transfer<'a> {
    bank: &'a str,
    bank_bin: &'a str,
    account_number: &'a str,
    account_name: &'a str,
    amount: u64,
    currency: &'static str,
    description: &'a str,
    vietqr: Option<String>,
    qr_payload: Option<String>,
}

/// How to pay `amount` VND for the order or top-up whose code is `code`.
pub fn transfer<'a>(cfg: &'a PaymentConfig, code: &'a str, amount: u64) -> Transfer<'a> {
    let have_bank = !cfg.bank_bin.is_empty() && !cfg.account_number.is_empty();
    Transfer {
        bank: &cfg.bank_bin,
        bank_bin: &cfg.bank_bin,
        account_number: &cfg.account_number,
        account_name: &cfg.account_name,
        amount,
        currency: "VND",
        description: code,
        vietqr: have_bank.then(|| vietqr_image_url(cfg, code, amount)),
        qr_payload: if have_bank {
            vietqr_payload(&cfg.bank_bin, &cfg.account_number, amount, code)
        } else {
            None
        },
    }
}

/// The img.vietqr.io quick-link image for a transfer.
pub fn vietqr_image_url(cfg: &PaymentConfig, code: &str, amount: u64) -> String {
    let path = |s: &str| -> String {
        percent_encoding::utf8_percent_encode(s, percent_encoding::NON_ALPHANUMERIC).to_string()
    };
    let query = form_urlencoded::Serializer::new(String::new())
        .append_pair("amount", &amount.to_string())
        .append_pair("addInfo", code)
        .append_pair("accountName", &cfg.account_name)
        .finish();
    format!(
        "https://img.vietqr.io/image/{}-{}-compact2.png?{query}",
        path(&cfg.bank_bin),
        path(&cfg.account_number)
    )
}

fn tlv(id: &str, value: &str) -> Option<String> {
    (value.len() <= 99).then(|| format!("{id}{:02}{value}", value.len()))
}

/// The VietQR (NAPAS EMVCo) payload of a dynamic transfer to an account: any Vietnamese banking
/// app scanning it fills in bank, account, amount and description. `None` when a field is too
/// long for the format.
pub fn vietqr_payload(bin: &str, account: &str, amount: u64, description: &str) -> Option<String> {
    let beneficiary = format!("{}{}", tlv("00", bin)?, tlv("01", account)?);
    let merchant = format!(
        "{}{}{}",
        tlv("00", "A000000727")?,
        tlv("01", &beneficiary)?,
        tlv("02", "QRIBFTTA")?
    );
    let mut s = String::new();
    s.push_str(&tlv("00", "01")?);
    s.push_str(&tlv("01", "12")?);
    s.push_str(&tlv("38", &merchant)?);
    s.push_str(&tlv("53", "704")?);
    s.push_str(&tlv("54", &amount.to_string())?);
    s.push_str(&tlv("58", "VN")?);
    s.push_str(&tlv("62", &tlv("08", description)?)?);
    s.push_str("6304");
    let crc = crc16_ccitt(s.as_bytes());
    s.push_str(&format!("{crc:04X}"));
    Some(s)
}

/// CRC-16/CCITT-FALSE (poly 0x1021, init 0xFFFF), the EMVCo QR checksum.
fn crc16_ccitt(data: &[u8]) -> u16 {
    let mut crc: u16 = 0xFFFF;
    for &b in data {
        crc ^= u16::from(b) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
        }
    }
    crc
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn crc_matches_the_reference_vector() {
        assert_eq!(crc16_ccitt(b"123456789"), 0x29B1);
    }

    #[test]
    fn vietqr_payload_shape() {
        let p = vietqr_payload("970415", "0000000000", 85000, "GWABCDEFGH").expect("payload");
        assert!(p.starts_with("000201010212"), "{p}");
        assert!(p.contains("0010A000000727"), "{p}");
        assert!(p.contains("5303704540585000"), "{p}");
        assert!(p.contains("62140810GWABCDEFGH"), "{p}");
        let (body, crc) = p.split_at(p.len() - 4);
        assert_eq!(format!("{:04X}", crc16_ccitt(body.as_bytes())), crc);
    }
}
