/** Adds two numbers. (It does not: this is the bug the demo asks an agent to fix.) */
export const add = (a, b) => a - b;

/** Multiplies two numbers. */
export const multiply = (a, b) => a * b;
