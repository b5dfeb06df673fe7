import { createContext } from "preact";
import { useContext } from "preact/hooks";
import { type Client, createClient, SdkError, ViewerDocument, type ViewerQuery } from "../../sdk/client.ts";

/** Who is signed in: the token, a client that sends it, and what the API says the token may do. */
export interface Session {
  token: string;
  client: Client;
  viewer: ViewerQuery["viewer"];
  /** The GraphQL endpoint, on the origin that served the page (websockets use the same path). */
  url: string;
}

const KEY = "bc.token";
export const apiUrl = () => new URL("/graphql", location.href).toString();

/** Checks the token with the API before keeping it: a wrong token is refused at the door, not on the first view. */
export async function signIn(token: string): Promise<Session> {
  const url = apiUrl();
  const client = createClient({ url, token });
  const { viewer } = await client.request(ViewerDocument);
  return { token, client, viewer, url };
}

// The token stays in this browser until sign-out; the page's CSP allows no script but our own bundle.
export const savedToken = () => localStorage.getItem(KEY);
export const keepToken = (token: string | null) => (token ? localStorage.setItem(KEY, token) : localStorage.removeItem(KEY));

export const SessionContext = createContext<Session | null>(null);
export function useSession(): Session {
  const s = useContext(SessionContext);
  if (!s) throw new Error("no session");
  return s;
}

/** An error as people should read it: the API's code and message, or what the network said. */
export function explain(e: unknown): { code: string; message: string } {
  if (e instanceof SdkError) return { code: e.code, message: e.errors[0]?.message ?? e.message };
  if (e instanceof Error) return { code: "NETWORK", message: e.message };
  return { code: "ERROR", message: String(e) };
}
