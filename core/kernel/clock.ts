/** Time is injected everywhere it decides something, so tests move it instead of sleeping. */
export type Clock = () => Date;

export const systemClock: Clock = () => new Date();
