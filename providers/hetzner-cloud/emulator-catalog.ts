/**
 * What the emulated project can buy: a few real server types, locations and system images, in the shapes the
 * API gives them. The numbers follow Hetzner's public catalog closely enough to look familiar; they are not a
 * price list.
 */

export interface Location {
  id: number;
  name: string;
  description: string;
  country: string;
  city: string;
  latitude: number;
  longitude: number;
  network_zone: string;
}

export const LOCATIONS: Location[] = [
  {
    id: 1,
    name: "fsn1",
    description: "Falkenstein DC Park 1",
    country: "DE",
    city: "Falkenstein",
    latitude: 50.47612,
    longitude: 12.370071,
    network_zone: "eu-central",
  },
  {
    id: 2,
    name: "nbg1",
    description: "Nuremberg DC Park 1",
    country: "DE",
    city: "Nuremberg",
    latitude: 49.452102,
    longitude: 11.076665,
    network_zone: "eu-central",
  },
  {
    id: 3,
    name: "hel1",
    description: "Helsinki DC Park 1",
    country: "FI",
    city: "Helsinki",
    latitude: 60.169855,
    longitude: 24.938379,
    network_zone: "eu-central",
  },
];

const TB = 1024 ** 4;

interface TypeSpec {
  id: number;
  name: string;
  description: string;
  cores: number;
  memory: number;
  disk: number;
  cpuType: "shared" | "dedicated";
  monthlyNet: number;
  /** Location name → whether it can be ordered there now; absent locations do not sell it at all. */
  sold: Record<string, boolean>;
  deprecated?: boolean;
}

const SPECS: TypeSpec[] = [
  {
    id: 104,
    name: "cx22",
    description: "CX22",
    cores: 2,
    memory: 4,
    disk: 40,
    cpuType: "shared",
    monthlyNet: 3.79,
    sold: { fsn1: true, nbg1: true, hel1: true },
  },
  {
    id: 105,
    name: "cx32",
    description: "CX32",
    cores: 4,
    memory: 8,
    disk: 80,
    cpuType: "shared",
    monthlyNet: 6.8,
    sold: { fsn1: true, nbg1: true, hel1: true },
  },
  {
    id: 106,
    name: "cx42",
    description: "CX42",
    cores: 8,
    memory: 16,
    disk: 160,
    cpuType: "shared",
    monthlyNet: 16.4,
    sold: { fsn1: true, nbg1: true, hel1: false },
  },
  { id: 22, name: "cpx11", description: "CPX 11", cores: 2, memory: 2, disk: 40, cpuType: "shared", monthlyNet: 4.35, sold: { fsn1: true, nbg1: true } },
  {
    id: 1,
    name: "cx11",
    description: "CX11",
    cores: 1,
    memory: 2,
    disk: 20,
    cpuType: "shared",
    monthlyNet: 3.29,
    sold: { fsn1: true, nbg1: true },
    deprecated: true,
  },
];

const money = (n: number) => n.toFixed(10);

export const serverTypeJson = (s: TypeSpec) => ({
  id: s.id,
  name: s.name,
  description: s.description,
  category: "shared_vcpu",
  cores: s.cores,
  memory: s.memory,
  disk: s.disk,
  storage_type: "local",
  cpu_type: s.cpuType,
  architecture: "x86",
  deprecated: s.deprecated ?? false,
  deprecation: s.deprecated ? { announced: "2024-06-06T00:00:00Z", unavailable_after: "2024-09-06T00:00:00Z" } : null,
  included_traffic: 20 * TB,
  prices: Object.keys(s.sold).map((location) => ({
    location,
    price_hourly: { net: money(s.monthlyNet / 730), gross: money((s.monthlyNet * 1.19) / 730) },
    price_monthly: { net: money(s.monthlyNet), gross: money(s.monthlyNet * 1.19) },
    included_traffic: 20 * TB,
    price_per_tb_traffic: { net: money(1), gross: money(1.19) },
  })),
  locations: LOCATIONS.filter((l) => l.name in s.sold).map((l) => ({
    id: l.id,
    name: l.name,
    available: s.sold[l.name] === true,
    recommended: s.sold[l.name] === true,
    deprecation: null,
  })),
});

export const SERVER_TYPES = SPECS;
export type ServerTypeSpec = TypeSpec;

export interface Image {
  id: number;
  name: string;
  description: string;
  osFlavor: string;
  osVersion: string;
}

export const IMAGES: Image[] = [
  { id: 161547269, name: "ubuntu-24.04", description: "Ubuntu 24.04", osFlavor: "ubuntu", osVersion: "24.04" },
  { id: 67794396, name: "ubuntu-22.04", description: "Ubuntu 22.04", osFlavor: "ubuntu", osVersion: "22.04" },
  { id: 114690387, name: "debian-12", description: "Debian 12", osFlavor: "debian", osVersion: "12" },
];

export const imageJson = (i: Image) => ({
  id: i.id,
  type: "system",
  status: "available",
  name: i.name,
  description: i.description,
  image_size: null,
  disk_size: 5,
  created: "2024-04-25T00:00:00Z",
  created_from: null,
  bound_to: null,
  os_flavor: i.osFlavor,
  os_version: i.osVersion,
  rapid_deploy: true,
  protection: { delete: false },
  deprecated: null,
  deleted: null,
  labels: {},
  architecture: "x86",
});

/** By id (a number or its digits) or by name, as the API resolves `server_type`, `image` and `location`. */
export function byIdOrName<T extends { id: number; name: string }>(list: T[], ref: unknown): T | undefined {
  if (typeof ref === "number") return list.find((x) => x.id === ref);
  if (typeof ref !== "string") return undefined;
  return list.find((x) => x.name === ref || String(x.id) === ref);
}
