/**
 * How the CLI reads a result with the protocol package's output schema (the one the Server's tool writes it
 * with), so that a Server one version apart does not break it:
 * - an object drops fields it does not know instead of refusing them;
 * - an enum other than the run state takes any string (a newer Server's value is shown as sent, through
 *   terminal-text.ts like every string); the run state stays closed: the exit code is a function of it;
 * - string patterns, lengths and number bounds are the Server's to keep: not checked again.
 * Fields, their types and which are required or nullable are the protocol's. The static type stays the
 * protocol's (an unknown enum value reaches a `default:` branch, never an exhaustive one).
 */
import { RunState } from "@webcodex/protocol";
import { z } from "zod";

export function tolerant(schema: z.ZodType): z.ZodType {
  if (schema === RunState) return schema;
  if (schema instanceof z.ZodObject) {
    const shape: Record<string, z.ZodType> = {};
    for (const [key, field] of Object.entries(schema.shape as Record<string, z.ZodType>)) shape[key] = tolerant(field);
    return z.object(shape);
  }
  if (schema instanceof z.ZodOptional) return tolerant(schema.unwrap() as z.ZodType).optional();
  if (schema instanceof z.ZodNullable) return tolerant(schema.unwrap() as z.ZodType).nullable();
  if (schema instanceof z.ZodDefault) return tolerant(schema.unwrap() as z.ZodType);
  if (schema instanceof z.ZodArray) return z.array(tolerant(schema.element as z.ZodType));
  if (schema instanceof z.ZodUnion) {
    const options = schema.options as readonly z.ZodType[];
    return z.union(options.map(tolerant) as [z.ZodType, z.ZodType, ...z.ZodType[]]);
  }
  if (schema instanceof z.ZodEnum || schema instanceof z.ZodString) return z.string();
  if (schema instanceof z.ZodNumber) return z.number();
  return schema;
}

type IsUnion<T, U = T> = T extends unknown ? ([U] extends [T] ? false : true) : false;
/** An enum (a union of string literals) other than the run state reads as any string. */
type ReadString<T extends string> = [T] extends [RunState] ? T : true extends IsUnion<T> ? string : T;
/**
 * The protocol's type as `tolerant` reads it: an enum other than the run state is any string, and an optional
 * field may also be given as `undefined`.
 */
export type Read<T> = [Exclude<T, null>] extends [string]
  ? ReadString<Exclude<T, null>> | Extract<T, null>
  : T extends readonly (infer E)[]
    ? Read<E>[]
    : T extends object
      ? { [K in keyof T as undefined extends T[K] ? never : K]: Read<T[K]> } & {
          [K in keyof T as undefined extends T[K] ? K : never]?: Read<Exclude<T[K], undefined>> | undefined;
        }
      : T;

/** `tolerant(schema)`, typed as it reads. */
export function readAs<T extends z.ZodType>(schema: T): z.ZodType<Read<z.infer<T>>> {
  return tolerant(schema) as z.ZodType<Read<z.infer<T>>>;
}
