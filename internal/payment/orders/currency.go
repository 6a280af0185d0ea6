package orders

import "strings"

// IsCurrency reports whether code is an active ISO 4217 alphabetic code.
func IsCurrency(code string) bool {
	_, ok := iso4217[code]
	return ok
}

// iso4217 lists the active alphabetic codes of ISO 4217 (list one, 2024),
// excluding fund, precious-metal and testing codes, which are not money here.
var iso4217 = set(`AED AFN ALL AMD AOA ARS AUD AWG AZN BAM BBD BDT BHD BIF BMD BND BOB BRL
BSD BTN BWP BYN BZD CAD CDF CHF CLP CNY COP CRC CUP CVE CZK DJF DKK DOP DZD EGP ERN ETB
EUR FJD FKP GBP GEL GHS GIP GMD GNF GTQ GYD HKD HNL HTG HUF IDR ILS INR IQD IRR ISK JMD
JOD JPY KES KGS KHR KMF KPW KRW KWD KYD KZT LAK LBP LKR LRD LSL LYD MAD MDL MGA MKD MMK
MNT MOP MRU MUR MVR MWK MXN MYR MZN NAD NGN NIO NOK NPR NZD OMR PAB PEN PGK PHP PKR PLN
PYG QAR RON RSD RUB RWF SAR SBD SCR SDG SEK SGD SHP SLE SOS SRD SSP STN SVC SYP SZL THB
TJS TMT TND TOP TRY TTD TWD TZS UAH UGX USD UYU UZS VED VES VND VUV WST XAF XCD XCG XOF
XPF YER ZAR ZMW ZWG`)

func set(codes string) map[string]struct{} {
	m := map[string]struct{}{}
	for _, c := range strings.Fields(codes) {
		m[c] = struct{}{}
	}
	return m
}
