/** The parser's own package ships no types; this is the part the tests use. */
declare module "parse-prometheus-text-format" {
  export default function parsePrometheusTextFormat(text: string): unknown[];
}
